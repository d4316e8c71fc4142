//! MovieLens catalogue files parsed from their bytes into [`ItemInfo`]: the title, and the
//! genres as labels. Shared by `dprec import` (which registers them) and the lab (which
//! reads the same public information from the data set).
//!
//! - 100K `u.item`: `id|title|release date|video date|IMDb URL|` then one 0/1 flag per
//!   genre, named by `u.genre` (`name|index` lines); Latin-1 text.
//! - 1M/10M `movies.dat`: `id::title::Genre|Genre`; Latin-1 text.
//! - latest/20M/25M `movies.csv`: a header, then `movieId,title,genres` with `|` between
//!   genres and titles quoted when they hold a comma (`""` for a quote); UTF-8 (a file
//!   that is not is read as Latin-1).
//!
//! The genre that says there is none (`unknown` in `u.genre`, `(no genres listed)` in the
//! newer files) gives no label. Bytes that are not valid text never fail a read: Latin-1
//! maps every byte to a character.

use super::ItemInfo;

/// Why a catalogue file could not be read, with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct CatalogueError {
    pub line: usize,
    pub reason: String,
}

/// The MovieLens-100K genres in `u.genre`'s order, for a `u.item` without its `u.genre`.
pub const ML100K_GENRES: [&str; 19] = [
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
];

/// Genre names that mean "no genre": never a label.
const NO_GENRE: [&str; 2] = ["unknown", "(no genres listed)"];

/// The layout of a MovieLens catalogue file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogueFormat {
    /// 100K `u.item` (genres from `u.genre`).
    UItem,
    /// 1M/10M `movies.dat`.
    MoviesDat,
    /// latest/20M/25M `movies.csv`.
    MoviesCsv,
}

impl CatalogueFormat {
    /// The format a catalogue file's name says (`u.item`, `*.dat`, `*.csv`).
    pub fn of_file_name(name: &str) -> Option<Self> {
        if name == "u.item" || name.ends_with(".item") {
            Some(Self::UItem)
        } else if name.ends_with(".dat") {
            Some(Self::MoviesDat)
        } else if name.ends_with(".csv") {
            Some(Self::MoviesCsv)
        } else {
            None
        }
    }

    /// Parses a file of this format; `genres` names `u.item`'s flags (ignored otherwise).
    pub fn parse(self, bytes: &[u8], genres: &[String]) -> Result<Vec<ItemInfo>, CatalogueError> {
        match self {
            Self::UItem => parse_u_item(bytes, genres),
            Self::MoviesDat => parse_movies_dat(bytes),
            Self::MoviesCsv => parse_movies_csv(bytes),
        }
    }
}

/// The genre names of a `u.genre` file, by index (`name|index` lines, indices 0..n).
pub fn parse_u_genre(bytes: &[u8]) -> Result<Vec<String>, CatalogueError> {
    let mut named: Vec<(usize, usize, String)> = Vec::new();
    for (n, line) in lines(bytes) {
        let text = latin1(line);
        let err = |reason: String| CatalogueError { line: n, reason };
        let (name, index) = text
            .rsplit_once('|')
            .ok_or_else(|| err(format!("expected `name|index`, got {text:?}")))?;
        let index: usize = index
            .trim()
            .parse()
            .map_err(|_| err(format!("genre index {index:?} is not a number")))?;
        named.push((index, n, name.trim().to_string()));
    }
    named.sort();
    let mut out = Vec::with_capacity(named.len());
    for (k, (index, n, name)) in named.into_iter().enumerate() {
        if index != k {
            return Err(CatalogueError {
                line: n,
                reason: format!("genre indices must be 0, 1, 2, ... without gaps; found {index} where {k} was expected"),
            });
        }
        out.push(name);
    }
    Ok(out)
}

/// Items of a `u.item` file; `genres` names its flags in order ([`parse_u_genre`], or
/// [`ML100K_GENRES`]).
pub fn parse_u_item(bytes: &[u8], genres: &[String]) -> Result<Vec<ItemInfo>, CatalogueError> {
    let mut out = Vec::new();
    for (n, line) in lines(bytes) {
        let text = latin1(line);
        let err = |reason: String| CatalogueError { line: n, reason };
        let fields: Vec<&str> = text.split('|').collect();
        if fields.len() != 5 + genres.len() {
            return Err(err(format!(
                "expected {} `|`-separated fields (id, title, two dates, URL, {} genre flags), found {}",
                5 + genres.len(),
                genres.len(),
                fields.len()
            )));
        }
        let mut labels = Vec::new();
        for (flag, genre) in fields[5..].iter().zip(genres) {
            match flag.trim() {
                "0" => {}
                "1" => push_genre(&mut labels, genre),
                other => {
                    return Err(err(format!(
                        "genre flag {other:?} of {genre:?} is not 0 or 1"
                    )))
                }
            }
        }
        out.push(ItemInfo {
            id: item_id(fields[0]).ok_or_else(|| err("no item id".into()))?,
            title: title(fields[1]),
            labels,
        });
    }
    Ok(out)
}

/// Items of a `movies.dat` file (`id::title::genres`).
pub fn parse_movies_dat(bytes: &[u8]) -> Result<Vec<ItemInfo>, CatalogueError> {
    let mut out = Vec::new();
    for (n, line) in lines(bytes) {
        let text = latin1(line);
        let err = |reason: String| CatalogueError { line: n, reason };
        let fields: Vec<&str> = text.split("::").collect();
        if fields.len() != 3 {
            return Err(err(format!(
                "expected 3 `::`-separated fields (id, title, genres), found {}",
                fields.len()
            )));
        }
        out.push(ItemInfo {
            id: item_id(fields[0]).ok_or_else(|| err("no item id".into()))?,
            title: title(fields[1]),
            labels: genre_list(fields[2]),
        });
    }
    Ok(out)
}

/// Items of a `movies.csv` file (a header line, then `movieId,title,genres`).
pub fn parse_movies_csv(bytes: &[u8]) -> Result<Vec<ItemInfo>, CatalogueError> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t.to_string(),
        Err(_) => latin1(bytes),
    };
    let mut records = csv_records(&text)?;
    let header = records
        .first()
        .is_some_and(|(_, r)| r[0].trim().eq_ignore_ascii_case("movieId"));
    if header {
        records.remove(0);
    }
    let mut out = Vec::new();
    for (n, record) in records {
        if record.len() != 3 {
            return Err(CatalogueError {
                line: n,
                reason: format!(
                    "expected 3 comma-separated fields (movieId, title, genres), found {}",
                    record.len()
                ),
            });
        }
        out.push(ItemInfo {
            id: item_id(&record[0]).ok_or_else(|| CatalogueError {
                line: n,
                reason: "no item id".into(),
            })?,
            title: title(&record[1]),
            labels: genre_list(&record[2]),
        });
    }
    Ok(out)
}

/// The non-blank lines of a file with their 1-based numbers, without line ends.
fn lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(k, l)| (k + 1, l.strip_suffix(b"\r").unwrap_or(l)))
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
}

/// Latin-1: every byte is the character of the same number.
fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

fn item_id(field: &str) -> Option<String> {
    Some(field.trim())
        .filter(|id| !id.is_empty())
        .map(str::to_string)
}

fn title(field: &str) -> Option<String> {
    Some(field.trim())
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

/// `Genre|Genre` as labels.
fn genre_list(field: &str) -> Vec<String> {
    let mut labels = Vec::new();
    for g in field.split('|') {
        push_genre(&mut labels, g);
    }
    labels
}

/// Adds a genre as a label unless it is empty, means "no genre", or is there already.
fn push_genre(labels: &mut Vec<String>, genre: &str) {
    let g = genre.trim();
    if !g.is_empty() && !NO_GENRE.contains(&g) && !labels.iter().any(|l| l == g) {
        labels.push(g.to_string());
    }
}

/// The records of a CSV text with the line each starts on: fields split on commas, a
/// field in double quotes may hold commas, line breaks and `""` (a quote). Blank lines
/// are skipped.
fn csv_records(text: &str) -> Result<Vec<(usize, Vec<String>)>, CatalogueError> {
    let mut records = Vec::new();
    let mut record: Vec<String> = Vec::new();
    let mut field = String::new();
    let (mut line, mut start) = (1, 1);
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => {
                line += usize::from(c == '\n');
                field.push(c);
            }
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\n') => {
                record.push(std::mem::take(&mut field));
                end_record(&mut records, &mut record, start);
                line += 1;
                start = line;
            }
            (false, '\r') if chars.peek() == Some(&'\n') => {}
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err(CatalogueError {
            line: start,
            reason: "a quoted field is not closed".into(),
        });
    }
    record.push(field);
    end_record(&mut records, &mut record, start);
    Ok(records)
}

/// Keeps `record` (unless it is a blank line) and starts the next one.
fn end_record(records: &mut Vec<(usize, Vec<String>)>, record: &mut Vec<String>, start: usize) {
    let blank = record.len() == 1 && record[0].trim().is_empty();
    let done = std::mem::take(record);
    if !blank {
        records.push((start, done));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, title: Option<&str>, labels: &[&str]) -> ItemInfo {
        ItemInfo {
            id: id.into(),
            title: title.map(str::to_string),
            labels: labels.iter().map(|l| l.to_string()).collect(),
        }
    }

    fn genres(names: &[&str]) -> Vec<String> {
        names.iter().map(|g| g.to_string()).collect()
    }

    #[test]
    fn u_genre_names_the_flags_by_index() {
        let g = parse_u_genre(b"unknown|0\nAction|1\r\nChildren's|2\n\n").unwrap();
        assert_eq!(g, ["unknown", "Action", "Children's"]);
        // Out of order is fine; a gap is not.
        assert_eq!(parse_u_genre(b"B|1\nA|0\n").unwrap(), ["A", "B"]);
        let e = parse_u_genre(b"A|0\nB|2\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(parse_u_genre(b"A|x\n")
            .unwrap_err()
            .to_string()
            .contains("line 1"));
    }

    #[test]
    fn u_item_gives_titles_and_genres_in_latin1() {
        let g = genres(&["unknown", "Action", "Comedy"]);
        let bytes = b"1|Toy Story (1995)|01-Jan-1995||http://x|0|0|1\n\
            2|Caf\xe9 au lait (1993)|01-Jan-1993||http://y|0|1|1\r\n\
            267|unknown||||1|0|0\n\n";
        assert_eq!(
            parse_u_item(bytes, &g).unwrap(),
            [
                info("1", Some("Toy Story (1995)"), &["Comedy"]),
                info("2", Some("Café au lait (1993)"), &["Action", "Comedy"]),
                // "unknown" is the genre of no genre: no label.
                info("267", Some("unknown"), &[]),
            ]
        );
        let e = parse_u_item(b"1|A|||x|0|1\n", &g).unwrap_err();
        assert!(e.reason.contains("expected 8"), "{e}");
        let e = parse_u_item(b"1|A|||x|0|1|0\n2|B|||x|0|2|0\n", &g).unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        let e = parse_u_item(b"|A|||x|0|1|0\n", &g).unwrap_err();
        assert!(e.reason.contains("no item id"), "{e}");
    }

    #[test]
    fn the_built_in_genres_are_the_100k_ones() {
        let g: Vec<String> = ML100K_GENRES.iter().map(|s| s.to_string()).collect();
        let line = format!(
            "1|Toy Story (1995)|01-Jan-1995||u|{}\n",
            "0|0|0|1|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0"
        );
        let items = parse_u_item(line.as_bytes(), &g).unwrap();
        assert_eq!(items[0].labels, ["Animation", "Children's", "Comedy"]);
    }

    #[test]
    fn movies_dat_in_latin1() {
        let bytes = b"1::Toy Story (1995)::Animation|Children's|Comedy\n\
            2::Am\xe9lie (2001)::Comedy|Romance\n";
        assert_eq!(
            parse_movies_dat(bytes).unwrap(),
            [
                info(
                    "1",
                    Some("Toy Story (1995)"),
                    &["Animation", "Children's", "Comedy"]
                ),
                info("2", Some("Amélie (2001)"), &["Comedy", "Romance"]),
            ]
        );
        assert_eq!(parse_movies_dat(b"1::A\n").unwrap_err().line, 1);
    }

    #[test]
    fn movies_csv_with_quoted_titles() {
        let text = "movieId,title,genres\n\
            1,Toy Story (1995),Adventure|Animation\n\
            11,\"American President, The (1995)\",Comedy|Drama|Romance\r\n\
            \n\
            2,\"Say \"\"Hi\"\" (2000)\",(no genres listed)\n\
            3,Hyena Road ,Drama|Drama\n";
        assert_eq!(
            parse_movies_csv(text.as_bytes()).unwrap(),
            [
                info("1", Some("Toy Story (1995)"), &["Adventure", "Animation"]),
                info(
                    "11",
                    Some("American President, The (1995)"),
                    &["Comedy", "Drama", "Romance"]
                ),
                info("2", Some("Say \"Hi\" (2000)"), &[]),
                info("3", Some("Hyena Road"), &["Drama"]),
            ]
        );
        // Not UTF-8: read as Latin-1, not refused.
        let items = parse_movies_csv(b"movieId,title,genres\n5,Caf\xe9,Drama\n").unwrap();
        assert_eq!(items[0].title.as_deref(), Some("Café"));
        let e = parse_movies_csv(b"movieId,title,genres\n1,A,B\n2,\"B\n").unwrap_err();
        assert_eq!(
            (e.line, e.reason.as_str()),
            (3, "a quoted field is not closed")
        );
        let e = parse_movies_csv(b"movieId,title,genres\n1,A\n").unwrap_err();
        assert!(e.reason.contains("found 2"), "{e}");
    }

    #[test]
    fn the_format_follows_the_file_name() {
        assert_eq!(
            CatalogueFormat::of_file_name("u.item"),
            Some(CatalogueFormat::UItem)
        );
        assert_eq!(
            CatalogueFormat::of_file_name("movies.dat"),
            Some(CatalogueFormat::MoviesDat)
        );
        assert_eq!(
            CatalogueFormat::of_file_name("movies.csv"),
            Some(CatalogueFormat::MoviesCsv)
        );
        assert_eq!(CatalogueFormat::of_file_name("u.data"), None);
    }
}
