//! The values a statement binds, each kind with one conversion to SQLite's: counts saturate at
//! `i64::MAX`, times are Unix milliseconds, a timing's source is `engine` or `measured`.

use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::types::{ToSqlOutput, ValueRef};
use switchyard_record::{Source, TokenPhase};

/// One parameter value of the request insert, borrowed from its row.
#[derive(Debug, Clone, Copy)]
pub(in crate::ledger) enum Param<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
}

/// Equal when binding one in place of the other would store the same value: reals compare bit
/// for bit (`-0.0` is not `0.0` here).
impl PartialEq for Param<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Null, Self::Null) => true,
            (Self::Int(a), Self::Int(b)) => a == b,
            (Self::Real(a), Self::Real(b)) => a.to_bits() == b.to_bits(),
            (Self::Text(a), Self::Text(b)) => a == b,
            _ => false,
        }
    }
}

impl<'a> Param<'a> {
    pub(in crate::ledger) fn text(value: Option<&'a str>) -> Self {
        value.map_or(Self::Null, Self::Text)
    }

    pub(in crate::ledger) fn real(value: Option<f64>) -> Self {
        value.map_or(Self::Null, Self::Real)
    }

    /// A count: SQLite integers are signed 64-bit.
    pub(in crate::ledger) fn count(value: Option<u64>) -> Self {
        int(value).map_or(Self::Null, Self::Int)
    }
}

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Self::Null => ValueRef::Null,
            Self::Int(n) => ValueRef::Integer(n),
            Self::Real(x) => ValueRef::Real(x),
            Self::Text(s) => ValueRef::Text(s.as_bytes()),
        }))
    }
}

/// SQLite integers are signed 64-bit.
pub(in crate::ledger) fn int(v: Option<u64>) -> Option<i64> {
    v.map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}

pub(in crate::ledger) fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(in crate::ledger) fn source(p: &Option<TokenPhase>) -> Option<&'static str> {
    p.map(|p| match p.source {
        Source::Engine => "engine",
        Source::Measured => "measured",
    })
}
