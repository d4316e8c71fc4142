fn main() -> std::process::ExitCode {
    dprec_lab::cli::main()
}
