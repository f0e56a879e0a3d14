//! Price books: the operator's prices per resource type and attribute, read and checked once
//! at start (format, currency, dates, every component priced by one rule), and where each book
//! applies (`PriceBooks`: by provider, region and tenant).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::FORMAT;

/// One price book file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceBook {
    /// The format, [`FORMAT`].
    pub price_book: u32,
    pub name: String,
    /// ISO 4217, as `USD`.
    pub currency: String,
    /// When the prices were read from their sources (`YYYY-MM-DD`).
    pub as_of: String,
    /// The region the prices are for, when they depend on one.
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    pub resources: BTreeMap<String, Pricing>,
}

/// How one resource type is priced.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    /// The type costs nothing of itself (a network, a role).
    #[serde(default)]
    pub free: bool,
    #[serde(default)]
    pub components: Vec<Component>,
    /// Charges that depend on usage, named so an estimate says they are not in it.
    #[serde(default)]
    pub usage_based: Vec<String>,
}

/// A charge: `price` per `per`, times `quantity`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Component {
    pub name: String,
    pub per: Per,
    #[serde(default)]
    pub quantity: Quantity,
    pub price: Price,
    /// Where the price was read (a public price page).
    pub source: String,
    /// When, if not the book's `as_of`.
    #[serde(default)]
    pub as_of: Option<String>,
}

/// The period a unit price is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Per {
    Hour,
    Month,
}

/// How many units: a number, or an attribute of the resource (`size`, `scaling_config.0.desired_size`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    Fixed(f64),
    Attribute {
        attribute: String,
        /// When the attribute is null (not set, no provider default).
        #[serde(default)]
        default: Option<f64>,
    },
}

impl Default for Quantity {
    fn default() -> Self {
        Self::Fixed(1.0)
    }
}

/// A unit price, or one per value of an attribute.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Price {
    Fixed(f64),
    By {
        by: String,
        values: BTreeMap<String, f64>,
    },
}

/// The books of a folder, one pricing per resource type.
#[derive(Clone, Debug)]
pub struct PriceBooks {
    pub currency: String,
    pub books: Vec<BookRef>,
    /// Each type's pricing and the index of its book.
    types: BTreeMap<String, (usize, Pricing)>,
}

/// A book an estimate used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BookRef {
    pub name: String,
    pub as_of: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// Why a runner's price books cannot be used; each names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum PriceBookError {
    #[error("cannot read the price book folder {}: {source}", dir.display())]
    Folder {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read the price book {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `problem` names the field and what is wrong with it.
    #[error("the price book {} is invalid: {problem}", path.display())]
    Invalid { path: PathBuf, problem: String },
    #[error(
        "the price book {} is in {currency}, the others in {others}: keep the books of one runner in one currency",
        path.display()
    )]
    Currencies {
        path: PathBuf,
        currency: String,
        others: String,
    },
    #[error("{resource_type} is priced in both {} and {}: keep it in one", first.display(), second.display())]
    PricedTwice {
        resource_type: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("the price book folder holds no book (*.yaml, *.yml, *.json)")]
    NoBook,
}

impl PriceBooks {
    /// Reads every `*.yaml`, `*.yml` and `*.json` book in `dir`; `None` when there is no such
    /// folder.
    ///
    /// # Errors
    /// The file and what is wrong with it: not a book of [`FORMAT`], a bad price, two books
    /// for one type, books in different currencies.
    pub fn load(dir: &Path) -> Result<Option<Self>, PriceBookError> {
        if !dir.is_dir() {
            return Ok(None);
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| PriceBookError::Folder {
                dir: dir.to_owned(),
                source,
            })?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
            })
            .collect();
        files.sort();
        let mut books = Vec::new();
        for path in files {
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(source) => return Err(PriceBookError::Read { path, source }),
            };
            let book = match PriceBook::parse(&text) {
                Ok(book) => book,
                Err(problem) => return Err(PriceBookError::Invalid { path, problem }),
            };
            books.push((path, book));
        }
        Self::from_books(books).map(Some)
    }

    /// Books read elsewhere, each with the file it came from.
    ///
    /// # Errors
    /// As [`PriceBooks::load`].
    pub fn from_books(books: Vec<(PathBuf, PriceBook)>) -> Result<Self, PriceBookError> {
        let mut merged = Self {
            currency: String::new(),
            books: Vec::new(),
            types: BTreeMap::new(),
        };
        let mut from: BTreeMap<String, PathBuf> = BTreeMap::new();
        for (path, book) in books {
            if merged.currency.is_empty() {
                merged.currency = book.currency.clone();
            } else if merged.currency != book.currency {
                return Err(PriceBookError::Currencies {
                    path,
                    currency: book.currency,
                    others: merged.currency,
                });
            }
            merged.books.push(BookRef {
                name: book.name.clone(),
                as_of: book.as_of.clone(),
                region: book.region.clone(),
            });
            for (ty, pricing) in book.resources {
                if let Some(first) = from.get(&ty) {
                    return Err(PriceBookError::PricedTwice {
                        resource_type: ty,
                        first: first.clone(),
                        second: path,
                    });
                }
                from.insert(ty.clone(), path.clone());
                merged.types.insert(ty, (merged.books.len() - 1, pricing));
            }
        }
        if merged.books.is_empty() {
            return Err(PriceBookError::NoBook);
        }
        Ok(merged)
    }

    /// How `resource_type` is priced, if a book has it.
    pub fn pricing(&self, resource_type: &str) -> Option<&Pricing> {
        self.types.get(resource_type).map(|(_, p)| p)
    }

    /// The book that prices `resource_type`.
    pub(super) fn book_of(&self, resource_type: &str) -> Option<usize> {
        self.types.get(resource_type).map(|(i, _)| *i)
    }
}

impl PriceBook {
    /// Parses one book (YAML or JSON) and checks it.
    ///
    /// # Errors
    /// What is wrong, with the field's path.
    pub fn parse(text: &str) -> Result<Self, String> {
        let book: Self = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        book.check()?;
        Ok(book)
    }

    pub(super) fn check(&self) -> Result<(), String> {
        if self.price_book != FORMAT {
            return Err(format!(
                "price_book: format {} is not one this runner reads ({FORMAT})",
                self.price_book
            ));
        }
        if self.currency.len() != 3 || !self.currency.chars().all(|c| c.is_ascii_uppercase()) {
            return Err(format!(
                "currency: {:?} is not an ISO 4217 code (as USD, EUR)",
                self.currency
            ));
        }
        check_date("as_of", &self.as_of)?;
        for (ty, pricing) in &self.resources {
            if pricing.free && !pricing.components.is_empty() {
                return Err(format!(
                    "resources.{ty}: is free and has components: keep one"
                ));
            }
            if !pricing.free && pricing.components.is_empty() && pricing.usage_based.is_empty() {
                return Err(format!(
                    "resources.{ty}: has no components: add some, or say `free: true` or what is `usage_based`"
                ));
            }
            for (i, c) in pricing.components.iter().enumerate() {
                let at = format!("resources.{ty}.components[{i}]");
                if c.name.trim().is_empty() {
                    return Err(format!("{at}.name: is empty"));
                }
                if !(c.source.starts_with("https://") || c.source.starts_with("http://")) {
                    return Err(format!(
                        "{at}.source: {:?} is not a link: cite the public price page the price was read from",
                        c.source
                    ));
                }
                if let Some(d) = &c.as_of {
                    check_date(&format!("{at}.as_of"), d)?;
                }
                let amounts: Vec<f64> = match &c.price {
                    Price::Fixed(p) => vec![*p],
                    Price::By { by, values } => {
                        if by.trim().is_empty() || values.is_empty() {
                            return Err(format!(
                                "{at}.price: name the attribute (`by`) and give `values`"
                            ));
                        }
                        values.values().copied().collect()
                    }
                };
                if amounts.iter().any(|p| !p.is_finite() || *p < 0.0) {
                    return Err(format!("{at}.price: prices must be numbers of 0 or more"));
                }
                match &c.quantity {
                    Quantity::Fixed(q) if !q.is_finite() || *q < 0.0 => {
                        return Err(format!("{at}.quantity: must be a number of 0 or more"));
                    }
                    Quantity::Attribute { attribute, .. } if attribute.trim().is_empty() => {
                        return Err(format!("{at}.quantity.attribute: is empty"));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

fn check_date(field: &str, text: &str) -> Result<(), String> {
    let parts: Vec<&str> = text.split('-').collect();
    let ok = match parts.as_slice() {
        [y, m, d] if y.len() == 4 && m.len() == 2 && d.len() == 2 => {
            match (y.parse::<i32>(), m.parse::<u8>(), d.parse::<u8>()) {
                (Ok(y), Ok(m), Ok(d)) => time::Month::try_from(m)
                    .ok()
                    .and_then(|m| time::Date::from_calendar_date(y, m, d).ok())
                    .is_some(),
                _ => false,
            }
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{field}: {text:?} is not a date (YYYY-MM-DD)"))
    }
}
