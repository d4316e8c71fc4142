//! MovieLens loaders: 100K (`u.data`, tab separated), 1M (`ratings.dat`, `::`) and
//! "latest" (`ratings.csv` with a header, half-star ratings).
//!
//! Every malformed line is reported with file, line number and reason; nothing panics
//! on bad input. External ids are interned into dense indices.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::{DataError, Dataset, IdMap, RatingScale, Ratings};

/// The on-disk layout of a MovieLens ratings file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// MovieLens-100K: `user\titem\trating\ttimestamp`.
    Ml100k,
    /// MovieLens-1M/10M: `user::item::rating::timestamp`.
    Ml1m,
    /// MovieLens "latest"/20M/25M CSV: header `userId,movieId,rating,timestamp`.
    LatestCsv,
}

impl Format {
    /// Guesses the format from the file name, then from the first line.
    pub fn detect(path: &Path) -> Result<Format, DataError> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".csv") {
            return Ok(Format::LatestCsv);
        }
        if name.ends_with(".dat") {
            return Ok(Format::Ml1m);
        }
        let file = open(path)?;
        let mut first = String::new();
        BufReader::new(file)
            .read_line(&mut first)
            .map_err(|e| io_err(path, e))?;
        if first.contains("::") {
            Ok(Format::Ml1m)
        } else if first.contains('\t') {
            Ok(Format::Ml100k)
        } else if first.contains(',') {
            Ok(Format::LatestCsv)
        } else {
            Err(DataError::Malformed {
                path: path.display().to_string(),
                line: 1,
                reason: LineError::UnknownFormat,
            })
        }
    }
}

/// One parsed line of a ratings file.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRating<'a> {
    pub user: &'a str,
    pub item: &'a str,
    pub value: f32,
    pub timestamp: Option<i64>,
}

/// Why a line of a ratings file is malformed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LineError {
    #[error("cannot tell the format: expected tab, '::' or comma separated fields")]
    UnknownFormat,
    #[error("expected 4 fields (user, item, rating, timestamp), found {0}")]
    FieldCount(usize),
    #[error("empty user id")]
    EmptyUser,
    #[error("empty item id")]
    EmptyItem,
    #[error("rating {0:?} is not a number")]
    NotANumber(String),
    #[error("rating {0:?} is not finite")]
    NotFinite(String),
    #[error("timestamp {0:?} is not an integer")]
    BadTimestamp(String),
    #[error("rating {value} is outside the scale [{min}, {max}]")]
    OutsideScale { value: f32, min: f64, max: f64 },
}

/// Parses one data line. `Ok(None)` means the line carries no rating (blank, or the CSV
/// header); `Err` gives the reason the line is malformed.
pub fn parse_line(format: Format, line: &str) -> Result<Option<RawRating<'_>>, LineError> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() {
        return Ok(None);
    }
    let fields: Vec<&str> = match format {
        Format::Ml100k => line.split('\t').collect(),
        Format::Ml1m => line.split("::").collect(),
        Format::LatestCsv => {
            if line.starts_with("userId") {
                return Ok(None);
            }
            line.split(',').collect()
        }
    };
    if fields.len() < 3 || fields.len() > 4 {
        return Err(LineError::FieldCount(fields.len()));
    }
    let user = fields[0].trim();
    let item = fields[1].trim();
    if user.is_empty() {
        return Err(LineError::EmptyUser);
    }
    if item.is_empty() {
        return Err(LineError::EmptyItem);
    }
    let value: f32 = fields[2]
        .trim()
        .parse()
        .map_err(|_| LineError::NotANumber(fields[2].to_owned()))?;
    if !value.is_finite() {
        return Err(LineError::NotFinite(fields[2].to_owned()));
    }
    let timestamp = match fields.get(3).map(|t| t.trim()) {
        None | Some("") => None,
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| LineError::BadTimestamp(t.to_owned()))?,
        ),
    };
    Ok(Some(RawRating {
        user,
        item,
        value,
        timestamp,
    }))
}

/// Reads `path` into `ratings`, interning ids through the given maps. When `scale` is
/// given, a value off the scale is an error naming the line.
pub fn read_into(
    path: &Path,
    format: Format,
    scale: Option<RatingScale>,
    users: &mut IdMap,
    items: &mut IdMap,
    ratings: &mut Ratings,
) -> Result<usize, DataError> {
    let reader = BufReader::with_capacity(1 << 20, open(path)?);
    let mut n = 0;
    for (k, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| io_err(path, e))?;
        let malformed = |reason: LineError| DataError::Malformed {
            path: path.display().to_string(),
            line: k + 1,
            reason,
        };
        let Some(raw) = parse_line(format, &line).map_err(malformed)? else {
            continue;
        };
        if let Some(s) = scale {
            if !s.contains(raw.value as f64) {
                return Err(malformed(LineError::OutsideScale {
                    value: raw.value,
                    min: s.min,
                    max: s.max,
                }));
            }
        }
        let u = users.intern(raw.user);
        let i = items.intern(raw.item);
        ratings.push(u, i, raw.value);
        n += 1;
    }
    Ok(n)
}

/// Loads one ratings file. The scale is detected from the data unless given.
pub fn load(
    path: &Path,
    format: Option<Format>,
    scale: Option<RatingScale>,
) -> Result<Dataset, DataError> {
    let format = match format {
        Some(f) => f,
        None => Format::detect(path)?,
    };
    let mut users = IdMap::new();
    let mut items = IdMap::new();
    let mut ratings = Ratings::default();
    read_into(path, format, scale, &mut users, &mut items, &mut ratings)?;
    if ratings.is_empty() {
        return Err(DataError::Invalid(format!(
            "{}: no ratings found",
            path.display()
        )));
    }
    let scale = match scale {
        Some(s) => s,
        None => RatingScale::detect(&ratings.values)?,
    };
    Ok(Dataset {
        ratings,
        users,
        items,
        scale,
    })
}

/// Finds the ratings file in a MovieLens directory (`u.data`, `ratings.dat` or
/// `ratings.csv`), or returns `path` itself when it is a file.
pub fn ratings_file(path: &Path) -> Result<PathBuf, DataError> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    for name in ["u.data", "ratings.dat", "ratings.csv"] {
        let p = path.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(DataError::Invalid(format!(
        "{}: no MovieLens ratings file (u.data, ratings.dat or ratings.csv) found",
        path.display()
    )))
}

/// The item catalogue file of a MovieLens release beside its ratings file, if present:
/// `u.item` (100K), `movies.dat` (1M/10M) or `movies.csv` (latest/20M/25M), the one of
/// the ratings' format first. `model::catalogue::movielens` parses it.
pub fn catalogue_file(ratings: &Path, format: Format) -> Option<PathBuf> {
    let dir = ratings.parent()?;
    let mut names = vec!["u.item", "movies.dat", "movies.csv"];
    let own = match format {
        Format::Ml100k => 0,
        Format::Ml1m => 1,
        Format::LatestCsv => 2,
    };
    names.swap(0, own);
    names.into_iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

/// True when `dir` holds the predefined MovieLens-100K splits u1..u5.
pub fn has_predefined_folds(dir: &Path) -> bool {
    (1..=5).all(|k| {
        dir.join(format!("u{k}.base")).is_file() && dir.join(format!("u{k}.test")).is_file()
    })
}

fn open(path: &Path) -> Result<File, DataError> {
    File::open(path).map_err(|e| io_err(path, e))
}

fn io_err(path: &Path, source: std::io::Error) -> DataError {
    DataError::Io {
        path: path.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &tempfile::TempDir, name: &str, body: &str) -> PathBuf {
        let p = dir.path().join(name);
        std::fs::File::create(&p)
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        p
    }

    #[test]
    fn parses_the_three_formats() {
        let d = tempfile::tempdir().unwrap();
        let a = write(
            &d,
            "u.data",
            "196\t242\t3\t881250949\n186\t302\t4\t891717742\n",
        );
        let b = write(
            &d,
            "ratings.dat",
            "1::1193::5::978300760\n1::661::3::978302109\n",
        );
        let c = write(
            &d,
            "ratings.csv",
            "userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n1,1029,3.0,1260759179\n",
        );
        let a = load(&a, None, None).unwrap();
        assert_eq!(a.ratings.len(), 2);
        assert_eq!(a.users.external(0), Some("196"));
        let b = load(&b, None, Some(RatingScale::ONE_TO_FIVE)).unwrap();
        assert_eq!(b.ratings.values, vec![5.0, 3.0]);
        assert_eq!(b.ratings.n_users, 1);
        let c = load(&c, None, None).unwrap();
        assert_eq!(c.ratings.values, vec![2.5, 3.0]);
        assert_eq!(c.scale.step, 0.5);
    }

    #[test]
    fn malformed_lines_name_file_line_and_reason() {
        let d = tempfile::tempdir().unwrap();
        let cases = [
            ("1\t2\t3\t4\n1\t2\tx\t4\n", 2, "not a number"),
            ("1\t2\n", 1, "expected 4 fields"),
            ("1\t\t3\t4\n", 1, "empty item id"),
            ("1\t2\tNaN\t4\n", 1, "not finite"),
            ("1\t2\t3\tyesterday\n", 1, "timestamp"),
            ("1\t2\t7\t4\n", 1, "outside the scale"),
        ];
        for (body, line, reason) in cases {
            let p = write(&d, "u.data", body);
            let err = load(&p, Some(Format::Ml100k), Some(RatingScale::ONE_TO_FIVE))
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("u.data:{line}:")), "{err}");
            assert!(err.contains(reason), "{err}");
        }
    }

    #[test]
    fn missing_file_is_an_error_not_a_panic() {
        let err = load(Path::new("/nonexistent/u.data"), None, None).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/u.data"));
    }
}

#[cfg(test)]
mod catalogue_tests {
    use super::*;

    #[test]
    fn the_catalogue_file_of_the_ratings_format_comes_first() {
        let dir = tempfile::tempdir().unwrap();
        let item = dir.path().join("u.item");
        let dat = dir.path().join("movies.dat");
        let ratings = dir.path().join("u1.base");
        assert_eq!(catalogue_file(&ratings, Format::Ml100k), None);
        std::fs::write(&item, "1|A|||x\n").unwrap();
        assert_eq!(catalogue_file(&ratings, Format::Ml1m), Some(item.clone()));
        std::fs::write(&dat, "10::A (1999)::Drama\n").unwrap();
        assert_eq!(catalogue_file(&ratings, Format::Ml100k), Some(item));
        assert_eq!(catalogue_file(&ratings, Format::Ml1m), Some(dat));
    }
}
