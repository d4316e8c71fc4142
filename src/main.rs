fn main() -> std::process::ExitCode {
    dprec::cli::main()
}
