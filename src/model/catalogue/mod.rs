//! Public item information: what the catalogue says about an item beside its id (a title,
//! categorical labels such as genres). It is public, like the ids (DESIGN 6): anything
//! computed from it and a user's own ratings costs no privacy budget, so it must never hold
//! anything derived from users' ratings. No I/O here; [`movielens`] parses MovieLens
//! catalogue files from their bytes.

pub mod movielens;

use serde::{Deserialize, Serialize};

/// One catalogue item and its public information.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemInfo {
    pub id: String,
    /// The display title, e.g. `"Toy Story (1995)"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Public categorical attributes (genres, a brand, ...), in the order given.
    #[serde(default)]
    pub labels: Vec<String>,
}

impl ItemInfo {
    /// An item known by its id only.
    pub fn plain(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            ..Self::default()
        }
    }

    /// The year of a MovieLens-style title ([`title_year`]).
    pub fn year(&self) -> Option<u16> {
        self.title.as_deref().and_then(title_year)
    }

    /// The title's lower-cased words without its year ([`title_words`]); none without a
    /// title.
    pub fn title_words(&self) -> Vec<String> {
        self.title.as_deref().map(title_words).unwrap_or_default()
    }
}

/// The year of a title ending in a parenthesised year, as MovieLens writes them:
/// `"Toy Story (1995)"` gives 1995; a range `"Show (2006-2007)"` gives its first year.
/// `None` when the title does not end that way.
pub fn title_year(title: &str) -> Option<u16> {
    let (_, group) = year_group(title)?;
    group[..4].parse().ok()
}

/// The title's words, lower-cased: split on every character that is not alphanumeric,
/// with the trailing year group ([`title_year`]) dropped. `"Usual Suspects, The (1995)"`
/// gives `["usual", "suspects", "the"]`.
pub fn title_words(title: &str) -> Vec<String> {
    let text = match year_group(title) {
        Some((head, _)) => head,
        None => title,
    };
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Splits `"Head (1995)"` into `("Head ", "1995")`: the last parenthesised group, when it
/// ends the title (trailing spaces allowed) and starts with four ASCII digits followed by
/// nothing or a range dash.
fn year_group(title: &str) -> Option<(&str, &str)> {
    let inner = title.trim_end().strip_suffix(')')?;
    let open = inner.rfind('(')?;
    let group = inner[open + 1..].trim();
    let digits = group.bytes().take_while(u8::is_ascii_digit).count();
    let rest = &group[digits..];
    let range = rest.is_empty() || rest.starts_with(['-', '\u{2013}']);
    (digits == 4 && range).then_some((&title[..open], group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn years_of_movielens_titles() {
        for (title, year) in [
            ("Toy Story (1995)", Some(1995)),
            ("Babe (1995) ", Some(1995)),
            (
                "City of Lost Children, The (Cité des enfants perdus, La) (1995)",
                Some(1995),
            ),
            ("Fawlty Towers (1975-1979)", Some(1975)),
            ("Cosmos (1980\u{2013}1981)", Some(1980)),
            ("1984 (1984)", Some(1984)),
            ("unknown", None),
            ("Hyena Road", None),
            ("Short (95)", None),
            ("Odd (19955)", None),
            ("Note (1995) extra", None),
            ("", None),
        ] {
            assert_eq!(title_year(title), year, "{title:?}");
        }
    }

    #[test]
    fn words_are_lower_cased_without_the_year() {
        assert_eq!(
            title_words("Usual Suspects, The (1995)"),
            ["usual", "suspects", "the"]
        );
        assert_eq!(
            title_words("City of Lost Children, The (Cité des enfants perdus, La) (1995)"),
            ["city", "of", "lost", "children", "the", "cité", "des", "enfants", "perdus", "la"]
        );
        assert_eq!(title_words("1984 (1984)"), ["1984"]);
        assert_eq!(title_words("Se7en"), ["se7en"]);
        assert!(title_words(" (1995)").is_empty());
    }

    #[test]
    fn an_item_without_a_title_has_no_year_and_no_words() {
        let plain = ItemInfo::plain("i1");
        assert_eq!((plain.year(), plain.title_words()), (None, vec![]));
        let toy = ItemInfo {
            id: "1".into(),
            title: Some("Toy Story (1995)".into()),
            labels: vec!["Animation".into()],
        };
        assert_eq!(
            (toy.year(), toy.title_words()),
            (Some(1995), vec!["toy".into(), "story".into()])
        );
    }
}
