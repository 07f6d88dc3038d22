//! Interned names: axis names, dimension symbols and reducer names.
//!
//! Types and e-nodes carry these names everywhere, and saturation clones, hashes and compares
//! them millions of times; an interned name is a copyable pointer to one shared string, so
//! cloning is free and equality is a pointer comparison. Order and hash follow the text, so
//! sorted output and hash-map iteration do not depend on the order names were interned in.

use std::borrow::Borrow;
use std::fmt;
use std::sync::{Mutex, OnceLock};

/// An interned string. Each distinct text is stored once for the life of the process (names
/// come from the source program and from the rules, so there are few of them).
#[derive(Clone, Copy)]
pub struct Sym(&'static str);

fn table() -> &'static Mutex<rustc_hash::FxHashSet<&'static str>> {
    static TABLE: OnceLock<Mutex<rustc_hash::FxHashSet<&'static str>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

impl Sym {
    pub fn new(text: &str) -> Sym {
        // A poisoned lock only means another thread panicked while inserting: the set
        // itself is still consistent.
        let mut set = table().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = set.get(text) {
            return Sym(s);
        }
        let leaked: &'static str = Box::leak(text.to_owned().into_boxed_str());
        set.insert(leaked);
        Sym(leaked)
    }

    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl Default for Sym {
    fn default() -> Sym {
        Sym::new("")
    }
}

impl std::ops::Deref for Sym {
    type Target = str;
    fn deref(&self) -> &str {
        self.0
    }
}

impl AsRef<str> for Sym {
    fn as_ref(&self) -> &str {
        self.0
    }
}

impl Borrow<str> for Sym {
    fn borrow(&self) -> &str {
        self.0
    }
}

impl PartialEq for Sym {
    fn eq(&self, other: &Sym) -> bool {
        // Interned: equal texts share one allocation.
        std::ptr::eq(self.0.as_ptr(), other.0.as_ptr()) && self.0.len() == other.0.len()
    }
}

impl Eq for Sym {}

impl PartialEq<str> for Sym {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Sym {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Sym {
    fn eq(&self, other: &String) -> bool {
        self.0 == other.as_str()
    }
}

impl PartialEq<Sym> for str {
    fn eq(&self, other: &Sym) -> bool {
        self == other.0
    }
}

impl PartialEq<Sym> for &str {
    fn eq(&self, other: &Sym) -> bool {
        *self == other.0
    }
}

impl PartialEq<Sym> for String {
    fn eq(&self, other: &Sym) -> bool {
        self.as_str() == other.0
    }
}

impl PartialOrd for Sym {
    fn partial_cmp(&self, other: &Sym) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Sym {
    fn cmp(&self, other: &Sym) -> std::cmp::Ordering {
        if self == other {
            std::cmp::Ordering::Equal
        } else {
            self.0.cmp(other.0)
        }
    }
}

impl std::hash::Hash for Sym {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As `str` hashes, so that `Borrow<str>` lookups agree.
        self.0.hash(state)
    }
}

impl fmt::Display for Sym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for Sym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

impl From<&str> for Sym {
    fn from(s: &str) -> Sym {
        Sym::new(s)
    }
}

impl From<&Sym> for Sym {
    fn from(s: &Sym) -> Sym {
        *s
    }
}

impl From<&String> for Sym {
    fn from(s: &String) -> Sym {
        Sym::new(s)
    }
}

impl From<String> for Sym {
    fn from(s: String) -> Sym {
        Sym::new(&s)
    }
}

impl From<Sym> for String {
    fn from(s: Sym) -> String {
        s.0.to_owned()
    }
}

impl serde::Serialize for Sym {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Sym;

    #[test]
    fn equal_texts_intern_to_one_symbol_and_order_by_text() {
        let a = Sym::new("p");
        let b = Sym::from(String::from("p"));
        assert_eq!(a, b);
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_ne!(Sym::new("p"), Sym::new("q"));
        // Interned later but ordered first: order follows the text.
        let z = Sym::new("zz_interned_first");
        let y = Sym::new("aa_interned_second");
        assert!(y < z);
        assert_eq!(a, "p");
    }
}
