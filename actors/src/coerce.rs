//! Cell coercion: the rules (docs/spec/decisions.md §3) that turn a raw JSON cell value written
//! through the API, a fixture or an import into the value a row stores, or refuse it with a reason.
//!
//! This module owns the whole contract of §3: `null` clears a cell; a scalar (or, for
//! `multi_select`, a list) is coerced by the column's type; the two wrapper forms
//! `{"value": V, "format": "..."}` and `{"formula": "=...", "value": V}` are checked for shape and
//! stored as sent with `V` replaced by its coerced form. It also maps a request's `cells` object
//! (keys are column ids as decimal strings) onto the sheet's columns. A report filter's operand
//! is a cell value too: [`coerce_operand`] coerces it by the same rules, so a filter compares
//! like with like, and [`cmp_stored_datetimes`] orders stored datetimes by the instants they
//! denote. A key's expiry is an instant sent to the service like a `datetime` cell, so
//! [`parse_instant`] reads it by the same rules: there is one RFC 3339 parser, not two that
//! disagree on edge cases.
//!
//! It is pure: no I/O, no clock, no shared state, only functions of their arguments. That keeps
//! the sheet actor, the HTTP layer and the fixture loader agreeing on one set of rules, makes
//! every rule testable in isolation, and lets a coerced value be coerced again with the same
//! result (what is stored always passes the rules again unchanged). No input makes it panic.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use chrono::{Datelike, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta, Timelike};
use serde_json::{Map, Number, Value};

use crate::model::{Column, ColumnId, ColumnType, Json, Millis, SortedCells};

/// The longest text cell, in characters (Unicode scalar values, not bytes).
pub const MAX_TEXT_CHARS: usize = 4000;

/// The longest `format` of a `{"value", "format"}` wrapper, in characters.
pub const MAX_FORMAT_CHARS: usize = 256;

/// The most fraction-of-second digits a datetime may carry (nanoseconds).
pub const MAX_DATETIME_FRACTION_DIGITS: usize = 9;

/// How many options a reason lists before it summarises the rest.
const OPTIONS_IN_REASON: usize = 20;

/// Up to this many options, a multi_select item is looked up by a scan of the column's options.
const SCANNED_OPTIONS: usize = 16;

/// How many characters of a refused string a reason quotes.
const QUOTED_CHARS: usize = 40;

/// What a coerced write does to a cell.
#[derive(Debug, Clone, PartialEq)]
pub enum CellWrite {
    /// Remove the cell (the raw value was a top-level `null`).
    Clear,
    /// Store this value (a coerced scalar, list or wrapper), to be read back verbatim.
    Set(Value),
}

/// Why a value was refused: the cell it was meant for and a readable reason naming what was
/// expected and what was sent, e.g. `expected a checkbox value (true, false, or the strings
/// "true"/"false"), got the string "yes"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column_id}: {reason}")]
pub struct CoerceError {
    /// The column the value was meant for, or the cell key as sent when it names no column id.
    pub column_id: CellKey,
    /// A sentence saying what was expected and what was sent.
    pub reason: String,
}

/// The cell a refusal names, as the error's `detail.column_id` shows it: a column id (an integer,
/// as docs/spec/decisions.md §3 has it), or, for a cell key that is no column id written as a
/// decimal integer, that key as sent (a string). Any stand-in integer (such as `0`) would name a
/// column the client never sent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum CellKey {
    /// A column id: the column's own, or an integer key that is no column of the sheet.
    Column(ColumnId),
    /// A key that is not a canonical decimal integer (`"abc"`, `"+101"`, `"0101"`), as sent.
    Sent(String),
}

impl std::fmt::Display for CellKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CellKey::Column(id) => write!(f, "{id}"),
            CellKey::Sent(key) => f.write_str(&quote(key)),
        }
    }
}

impl PartialEq<ColumnId> for CellKey {
    fn eq(&self, id: &ColumnId) -> bool {
        *self == CellKey::Column(*id)
    }
}

/// Coerce one raw value for a column.
///
/// A top-level `null` gives [`CellWrite::Clear`]; anything else that passes the rules gives
/// [`CellWrite::Set`] with the value to store. The error carries `column.id`.
pub fn coerce_cell(column: &Column, raw: &Value) -> Result<CellWrite, CoerceError> {
    coerce_value(column, Cow::Borrowed(raw))
}

/// [`coerce_cell`] of a value that is borrowed or owned: an owned value that passes as sent
/// (most do) becomes the stored value without a copy.
fn coerce_value(column: &Column, raw: Cow<'_, Value>) -> Result<CellWrite, CoerceError> {
    let stored = match &*raw {
        Value::Null => return Ok(CellWrite::Clear),
        Value::Object(wrapper) => coerce_wrapper(column, wrapper).map(Value::Object),
        _ => coerce_plain(column, raw),
    };
    stored
        .map(CellWrite::Set)
        .map_err(|reason| CoerceError { column_id: CellKey::Column(column.id), reason })
}

/// Coerce a whole cells object from a request or fixture.
///
/// Keys must be ids of `columns`, written as canonical decimal strings (`"101"`; no sign, no
/// leading zeros, no spaces). A key that is such an integer but not a column of the sheet fails
/// with that id as `column_id`; any other key fails with the key as sent as `column_id`. Values
/// are coerced with
/// [`coerce_cell`]. The first failure in the map's key order is returned; on success the writes
/// come back in column id order.
pub fn coerce_cells(
    columns: &BTreeMap<ColumnId, Column>,
    raw: &Map<String, Value>,
) -> Result<Vec<(ColumnId, CellWrite)>, CoerceError> {
    coerce_entries(columns, raw.iter().map(|(key, value)| (key, Cow::Borrowed(value))))
}

/// [`coerce_cells`] of a cells object the caller gives up (a bulk write's items): the values
/// move into the writes instead of being copied.
///
/// # Errors
/// As [`coerce_cells`].
pub fn coerce_owned_cells(
    columns: &BTreeMap<ColumnId, Column>,
    raw: Map<String, Value>,
) -> Result<Vec<(ColumnId, CellWrite)>, CoerceError> {
    coerce_entries(columns, raw.into_iter().map(|(key, value)| (key, Cow::Owned(value))))
}

fn coerce_entries<'a, K: AsRef<str>>(
    columns: &BTreeMap<ColumnId, Column>,
    entries: impl ExactSizeIterator<Item = (K, Cow<'a, Value>)>,
) -> Result<Vec<(ColumnId, CellWrite)>, CoerceError> {
    let mut writes = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let key = key.as_ref();
        let Some(id) = parse_column_key(key) else {
            return Err(CoerceError {
                column_id: CellKey::Sent(key.to_owned()),
                reason: format!(
                    "no column with id {} in this sheet (cell keys must be column ids written \
                     as decimal integers, e.g. \"101\")",
                    quote(key)
                ),
            });
        };
        let Some(column) = columns.get(&id) else {
            return Err(CoerceError {
                column_id: CellKey::Column(id),
                reason: format!("no column with id {id} in this sheet"),
            });
        };
        let write = coerce_value(column, value)
            .map_err(|e| CoerceError { column_id: CellKey::Column(id), reason: e.reason })?;
        writes.push((id, write));
    }
    writes.sort_by_key(|(id, _)| *id);
    Ok(writes)
}

/// Coerce a report filter's operand for `column`: exactly as a cell of that column is coerced
/// ([`coerce_cell`]), so an operand can only equal what a cell can hold, in the form a cell holds
/// it (`"5.0"` becomes the number `5.0`, a datetime with an offset its UTC form). The result is
/// what a stored cell's value is compared with: a wrapper counts as its `value`.
///
/// # Errors
///
/// Whatever [`coerce_cell`] refuses, and `null` (or a wrapper without a value), which clears a
/// cell but is no value to compare with.
pub fn coerce_operand(column: &Column, raw: &Value) -> Result<Value, CoerceError> {
    let refuse = |reason: &str| CoerceError {
        column_id: CellKey::Column(column.id),
        reason: reason.to_owned(),
    };
    match coerce_cell(column, raw)? {
        CellWrite::Clear => Err(refuse("null is no value to compare with")),
        CellWrite::Set(Value::Object(wrapper)) => match wrapper.get("value") {
            Some(value) if !value.is_null() => Ok(value.clone()),
            _ => Err(refuse("a wrapper without a value is no value to compare with")),
        },
        CellWrite::Set(value) => Ok(value),
    }
}

/// Order two datetimes in the stored form (`YYYY-MM-DDTHH:MM:SS[.fraction]Z`, what
/// [`coerce_cell`] stores for a `datetime` column) by the instants they denote. Text order is not
/// enough: the fraction is kept as sent, so `…:00Z`, `…:00.0Z` and `…:00.000Z` are one instant,
/// and `…:00.5Z` sorts before `…:00Z` as text. `None` when either is not in the stored form.
pub fn cmp_stored_datetimes(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let (a_clock, a_fraction) = stored_datetime_parts(a)?;
    let (b_clock, b_fraction) = stored_datetime_parts(b)?;
    // The clock parts have one fixed layout with 4-digit years, so text order is time order;
    // fractions compare digit by digit, a missing digit counting as 0.
    let digits = |f: &[u8], i: usize| f.get(i).copied().unwrap_or(b'0');
    let len = a_fraction.len().max(b_fraction.len());
    Some(a_clock.cmp(b_clock).then_with(|| {
        (0..len)
            .map(|i| digits(a_fraction, i).cmp(&digits(b_fraction, i)))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    }))
}

/// The `YYYY-MM-DDTHH:MM:SS` part and the fraction digits of a stored datetime.
fn stored_datetime_parts(s: &str) -> Option<(&[u8], &[u8])> {
    let b = s.as_bytes();
    let (clock, rest) = (b.get(..19)?, b.get(19..)?);
    let shaped = clock.iter().enumerate().all(|(i, c)| match i {
        4 | 7 => *c == b'-',
        10 => *c == b'T',
        13 | 16 => *c == b':',
        _ => c.is_ascii_digit(),
    });
    let fraction = match rest {
        [b'Z'] => &[][..],
        [b'.', digits @ .., b'Z']
            if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) =>
        {
            digits
        }
        _ => return None,
    };
    shaped.then_some((clock, fraction))
}

/// A cell key as a column id: `0` or a non-zero digit followed by digits, fitting in a `u64`.
/// The one spelling of a column id in a request body (cell keys, an upsert's `keyColumn`).
pub fn parse_column_key(key: &str) -> Option<ColumnId> {
    let canonical = !key.is_empty()
        && key.bytes().all(|b| b.is_ascii_digit())
        && (key == "0" || !key.starts_with('0'));
    if canonical {
        key.parse().ok()
    } else {
        None
    }
}

/// Check a wrapper object's shape and coerce its `value`; returns the wrapper to store.
fn coerce_wrapper(
    column: &Column,
    wrapper: &Map<String, Value>,
) -> Result<Map<String, Value>, String> {
    let value = wrapper.get("value");
    let only = |keys: usize| wrapper.len() == keys;
    match (wrapper.get("format"), wrapper.get("formula")) {
        (Some(format), None) if value.is_some() && only(2) => {
            let Value::String(format) = format else {
                return Err(format!(
                    "the \"format\" of a {{\"value\": V, \"format\": \"...\"}} cell must be a \
                     string, got {}",
                    describe(format)
                ));
            };
            let chars = format.chars().count();
            if chars > MAX_FORMAT_CHARS {
                return Err(format!(
                    "the \"format\" of a cell may be at most {MAX_FORMAT_CHARS} characters long, \
                     got {chars} characters"
                ));
            }
        }
        (None, Some(formula)) if only(if value.is_some() { 2 } else { 1 }) => {
            let Value::String(formula) = formula else {
                return Err(format!(
                    "the \"formula\" of a {{\"formula\": \"=...\", \"value\": V}} cell must be a \
                     string starting with \"=\", got {}",
                    describe(formula)
                ));
            };
            if !formula.starts_with('=') {
                return Err(format!(
                    "a formula must start with \"=\", got {}",
                    describe(&Value::String(formula.clone()))
                ));
            }
        }
        _ => {
            return Err(format!(
                "an object cell value must be {{\"value\": V, \"format\": \"...\"}} or \
                 {{\"formula\": \"=...\", \"value\": V}} (value optional) with no other keys, got \
                 {}",
                describe_keys(wrapper)
            ));
        }
    }
    let mut stored = wrapper.clone();
    if let Some(value) = value {
        let coerced = match value {
            Value::Null => Value::Null,
            Value::Object(_) => {
                return Err(
                    "the \"value\" inside a wrapper must be a plain value (or null), not another \
                     object"
                        .to_owned(),
                );
            }
            plain => coerce_plain(column, Cow::Borrowed(plain))
                .map_err(|reason| format!("the wrapper's \"value\" is refused: {reason}"))?,
        };
        stored.insert("value".to_owned(), coerced);
    }
    Ok(stored)
}

/// Coerce a non-null, non-object value by the column's type.
fn coerce_plain(column: &Column, raw: Cow<'_, Value>) -> Result<Value, String> {
    if raw.is_array() && column.ty != ColumnType::MultiSelect {
        return Err(format!(
            "a list is only accepted by multi_select columns; this is a {} column, got {}",
            column.ty.as_str(),
            describe(&raw)
        ));
    }
    let options = column.options.as_deref().unwrap_or(&[]);
    match column.ty {
        ColumnType::Text => coerce_text(raw),
        ColumnType::Number => coerce_number(raw),
        ColumnType::Checkbox => coerce_checkbox(raw),
        ColumnType::Date => coerce_date(raw),
        ColumnType::Datetime => coerce_datetime(raw),
        ColumnType::Contact => coerce_contact(raw),
        ColumnType::Dropdown | ColumnType::Symbol => coerce_option(column.ty, options, raw),
        ColumnType::MultiSelect => coerce_multi_select(options, raw),
    }
}

fn coerce_text(raw: Cow<'_, Value>) -> Result<Value, String> {
    match &*raw {
        Value::String(s) => {
            let chars = s.chars().count();
            if chars > MAX_TEXT_CHARS {
                Err(format!(
                    "text may be at most {MAX_TEXT_CHARS} characters long, got {chars} characters"
                ))
            } else {
                Ok(raw.into_owned())
            }
        }
        Value::Number(n) => Ok(Value::String(n.to_string())),
        Value::Bool(b) => Ok(Value::String(b.to_string())),
        other => Err(format!(
            "expected text (a string of at most {MAX_TEXT_CHARS} characters, a number or a \
             boolean), got {}",
            describe(other)
        )),
    }
}

fn coerce_number(raw: Cow<'_, Value>) -> Result<Value, String> {
    const EXPECTED: &str = "expected a number (a finite JSON number, or a string holding a \
                            decimal such as \"12\", \"-3.5\" or \"1e3\")";
    match &*raw {
        Value::Number(n) if n.as_f64().is_some_and(f64::is_finite) => Ok(raw.into_owned()),
        Value::String(s) if is_decimal_syntax(s) => match parse_decimal(s) {
            Some(n) => Ok(Value::Number(n)),
            None => {
                Err(format!("{EXPECTED}, got {}, which is too large to be finite", describe(&raw)))
            }
        },
        other => Err(format!("{EXPECTED}, got {}", describe(other))),
    }
}

/// `[+-]? (digits ("." digits?)? | "." digits) ([eE] [+-]? digits)?`, nothing else (no spaces,
/// no hex, no `NaN`/`inf`).
fn is_decimal_syntax(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let mut mantissa = digits(&mut i);
    if b.get(i) == Some(&b'.') {
        i += 1;
        mantissa += digits(&mut i);
    }
    if mantissa == 0 {
        return false;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// A decimal string (already checked by [`is_decimal_syntax`]) as a JSON number: an integer when
/// it has no fraction or exponent and fits `i64`/`u64`, else a finite `f64`.
fn parse_decimal(s: &str) -> Option<Number> {
    if !s.contains(['.', 'e', 'E']) {
        if let Ok(i) = s.parse::<i64>() {
            return Some(i.into());
        }
        if let Ok(u) = s.parse::<u64>() {
            return Some(u.into());
        }
    }
    s.parse::<f64>().ok().filter(|f| f.is_finite()).and_then(Number::from_f64)
}

fn coerce_checkbox(raw: Cow<'_, Value>) -> Result<Value, String> {
    match &*raw {
        Value::Bool(b) => Ok(Value::Bool(*b)),
        Value::String(s) if s == "true" => Ok(Value::Bool(true)),
        Value::String(s) if s == "false" => Ok(Value::Bool(false)),
        other => Err(format!(
            "expected a checkbox value (true, false, or the strings \"true\"/\"false\"), got {}",
            describe(other)
        )),
    }
}

/// `YYYY-MM-DD` as ASCII digits, checked against the calendar.
fn parse_date(s: &[u8]) -> Result<NaiveDate, &'static str> {
    let shaped = s.len() == 10
        && s.iter()
            .enumerate()
            .all(|(i, b)| if i == 4 || i == 7 { *b == b'-' } else { b.is_ascii_digit() });
    if !shaped {
        return Err("not of the form YYYY-MM-DD");
    }
    let year = i32::try_from(digits_value(&s[0..4])).map_err(|_| "year out of range")?;
    NaiveDate::from_ymd_opt(year, digits_value(&s[5..7]), digits_value(&s[8..10]))
        .ok_or("not a real calendar date")
}

/// The value of a run of ASCII digits (at most 9 of them, so it fits).
fn digits_value(digits: &[u8]) -> u32 {
    digits.iter().fold(0, |acc, d| acc * 10 + u32::from(d - b'0'))
}

fn coerce_date(raw: Cow<'_, Value>) -> Result<Value, String> {
    const EXPECTED: &str = "expected a date as \"YYYY-MM-DD\", e.g. \"2026-01-31\"";
    match &*raw {
        Value::String(s) => match parse_date(s.as_bytes()) {
            Ok(_) => Ok(raw.into_owned()),
            Err(why) => Err(format!("{EXPECTED}, got {} ({why})", describe(&raw))),
        },
        other => Err(format!("{EXPECTED}, got {}", describe(other))),
    }
}

fn coerce_datetime(raw: Cow<'_, Value>) -> Result<Value, String> {
    const EXPECTED: &str = "expected an RFC 3339 date-time with an offset, e.g. \
                            \"2026-01-02T03:04:05Z\" or \"2026-01-02T03:04:05.120+01:00\"";
    match &*raw {
        Value::String(s) => match normalize_datetime(s) {
            Ok(None) => Ok(raw.into_owned()),
            Ok(Some(utc)) => Ok(Value::String(utc)),
            Err(why) => Err(format!("{EXPECTED}, got {} ({why})", describe(&raw))),
        },
        other => Err(format!("{EXPECTED}, got {}", describe(other))),
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+hh:mm|-hh:mm)` (`t`/`z` also accepted, as RFC 3339 allows)
/// to `YYYY-MM-DDTHH:MM:SS[.fraction]Z` in UTC, the fraction digits kept as sent; `None` when
/// `s` is in that form already (the common case, which then needs no new text).
fn normalize_datetime(s: &str) -> Result<Option<String>, &'static str> {
    let (utc, fraction) = parse_rfc3339(s)?;
    // UTC with an upper-case `T` and `Z`: the parser took exactly these digits, so the form
    // below would be the text as sent.
    if s.as_bytes()[10] == b'T' && s.ends_with('Z') {
        return Ok(None);
    }
    Ok(Some(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{fraction}Z",
        utc.year(),
        utc.month(),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second()
    )))
}

/// An RFC 3339 date-time with an offset, by the rules of a `datetime` cell, as milliseconds
/// since the epoch (the fraction beyond milliseconds is dropped).
///
/// This is the one parser of instants sent to the service: a cell, a key's `expiresAt` in a
/// fixture, the admin API and the CLI all follow it, so a time one of them accepts is accepted
/// by all. It refuses what the cell rules refuse: a space for the `T`, a leap second (`:60`),
/// a missing offset, an instant outside the years 0000-9999 in UTC.
///
/// # Errors
/// Why the text is not such a time, as a phrase.
pub fn parse_instant(s: &str) -> Result<Millis, &'static str> {
    parse_rfc3339(s).map(|(utc, _)| utc.and_utc().timestamp_millis())
}

/// The instant of `s` in UTC (with its fraction as nanoseconds), and the fraction as sent
/// (with its leading `.`, or empty).
fn parse_rfc3339(s: &str) -> Result<(NaiveDateTime, &str), &'static str> {
    const SHAPE: &str = "not of the form YYYY-MM-DDTHH:MM:SS[.fraction] followed by Z or ±hh:mm";
    let b = s.as_bytes();
    if b.len() < 20 || !matches!(b[10], b'T' | b't') {
        return Err(SHAPE);
    }
    let date = parse_date(&b[..10])?;
    let clock = &b[11..19];
    let clock_shaped = clock.iter().enumerate().all(|(i, c)| {
        if i == 2 || i == 5 {
            *c == b':'
        } else {
            c.is_ascii_digit()
        }
    });
    if !clock_shaped {
        return Err(SHAPE);
    }
    let (hour, minute, second) =
        (digits_value(&clock[0..2]), digits_value(&clock[3..5]), digits_value(&clock[6..8]));
    if second == 60 {
        return Err("leap seconds are not accepted");
    }

    let mut rest = &b[19..];
    let mut fraction = "";
    let mut nanos = 0;
    if rest.first() == Some(&b'.') {
        let len = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if len == 0 {
            return Err("a '.' must be followed by fraction digits");
        }
        if len > MAX_DATETIME_FRACTION_DIGITS {
            return Err("at most 9 fraction-of-second digits are accepted");
        }
        // The digits are ASCII, so this slice sits on character boundaries.
        fraction = s.get(19..20 + len).ok_or(SHAPE)?;
        let digits = &rest[1..1 + len];
        nanos = digits_value(digits) * 10u32.pow((MAX_DATETIME_FRACTION_DIGITS - len) as u32);
        rest = &rest[1 + len..];
    }
    let time = NaiveTime::from_hms_nano_opt(hour, minute, second, nanos)
        .ok_or("not a real time of day")?;
    let offset_minutes = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2]
            if [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()) =>
        {
            let (hours, minutes) = (digits_value(&[*h1, *h2]), digits_value(&[*m1, *m2]));
            if hours > 23 || minutes > 59 {
                return Err("the offset must be between -23:59 and +23:59");
            }
            let magnitude = i64::from(hours * 60 + minutes);
            if *sign == b'-' {
                -magnitude
            } else {
                magnitude
            }
        }
        [] => return Err("the offset (Z or ±hh:mm) is missing"),
        _ => return Err(SHAPE),
    };
    let utc = TimeDelta::try_minutes(offset_minutes)
        .and_then(|offset| NaiveDateTime::new(date, time).checked_sub_signed(offset))
        .filter(|utc| (0..=9999).contains(&utc.year()))
        .ok_or("the instant falls outside the years 0000-9999 in UTC")?;
    Ok((utc, fraction))
}

fn coerce_contact(raw: Cow<'_, Value>) -> Result<Value, String> {
    const EXPECTED: &str = "expected a contact of the form local@domain, e.g. \"ada@example.com\"";
    let Value::String(s) = &*raw else {
        return Err(format!("{EXPECTED}, got {}", describe(&raw)));
    };
    let problem = if s.chars().any(char::is_whitespace) {
        Some("it contains whitespace")
    } else {
        match s.split_once('@') {
            None => Some("it has no '@'"),
            Some((_, domain)) if domain.contains('@') => Some("it has more than one '@'"),
            Some(("", _)) => Some("the part before '@' is empty"),
            Some((_, "")) => Some("the part after '@' is empty"),
            Some((_, domain)) if domain.starts_with('.') || domain.ends_with('.') => {
                Some("the domain starts or ends with a dot")
            }
            Some(_) => None,
        }
    };
    match problem {
        None => Ok(raw.into_owned()),
        Some(why) => Err(format!("{EXPECTED}, got {} ({why})", describe(&raw))),
    }
}

fn coerce_option(ty: ColumnType, options: &[String], raw: Cow<'_, Value>) -> Result<Value, String> {
    match &*raw {
        Value::String(s) if options.contains(s) => Ok(raw.into_owned()),
        _ if options.is_empty() => Err(format!(
            "this {} column has no options, so no value can be set (null clears the cell), got {}",
            ty.as_str(),
            describe(&raw)
        )),
        other => Err(format!(
            "expected one of the column's options {} (as a string), got {}",
            list_options(options),
            describe(other)
        )),
    }
}

fn coerce_multi_select(options: &[String], raw: Cow<'_, Value>) -> Result<Value, String> {
    let items = match &*raw {
        Value::Array(items) => items.as_slice(),
        Value::String(_) => std::slice::from_ref(&*raw),
        other => {
            return Err(format!(
                "expected a list of distinct options from {} (or one option as a string), got {}",
                list_options(options),
                describe(other)
            ));
        }
    };
    // Option lists are usually short: a scan finds an item's option without hashing every
    // option for every cell. A long list is indexed, so a cell's cost stays linear.
    let index: Option<HashMap<&str, usize>> = (options.len() > SCANNED_OPTIONS)
        .then(|| options.iter().enumerate().map(|(i, o)| (o.as_str(), i)).collect());
    let position = |s: &str| match &index {
        Some(index) => index.get(s).copied(),
        None => options.iter().position(|o| o == s),
    };
    let mut seen = vec![false; options.len()];
    for (index, item) in items.iter().enumerate() {
        let Value::String(s) = item else {
            return Err(format!(
                "item {index} of the list: expected one of the column's options {} as a string, \
                 got {}",
                list_options(options),
                describe(item)
            ));
        };
        let Some(option) = position(s) else {
            return Err(if options.is_empty() {
                format!(
                    "item {index} of the list: this multi_select column has no options, got {}",
                    describe(item)
                )
            } else {
                format!(
                    "item {index} of the list: expected one of the column's options {}, got {}",
                    list_options(options),
                    describe(item)
                )
            });
        };
        if std::mem::replace(&mut seen[option], true) {
            return Err(format!(
                "item {index} of the list repeats {}; the items of a multi_select cell must be \
                 distinct",
                describe(item)
            ));
        }
    }
    Ok(match raw.into_owned() {
        list @ Value::Array(_) => list,
        one => Value::Array(vec![one]),
    })
}

/// The options as a readable list, e.g. `["low", "high"]`, cut after [`OPTIONS_IN_REASON`].
fn list_options(options: &[String]) -> String {
    if options.is_empty() {
        return "[] (this column has no options)".to_owned();
    }
    let shown: Vec<String> = options.iter().take(OPTIONS_IN_REASON).map(|o| quote(o)).collect();
    let more = options.len().saturating_sub(OPTIONS_IN_REASON);
    if more == 0 {
        format!("[{}]", shown.join(", "))
    } else {
        format!("[{}, … and {more} more]", shown.join(", "))
    }
}

/// A string in JSON quotes, cut after [`QUOTED_CHARS`] characters (marked with `…`).
fn quote(s: &str) -> String {
    let mut chars = s.chars();
    let mut head: String = chars.by_ref().take(QUOTED_CHARS).collect();
    if chars.next().is_some() {
        head.push('…');
    }
    Value::String(head).to_string()
}

/// What a refused value was, for a reason: `the string "abc"`, `the number 12`, `a list of 2
/// items`...
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => {
            let chars = s.chars().count();
            if chars > QUOTED_CHARS {
                format!("the string {} ({chars} characters)", quote(s))
            } else {
                format!("the string {}", quote(s))
            }
        }
        Value::Array(items) if items.len() == 1 => "a list of 1 item".to_owned(),
        Value::Array(items) => format!("a list of {} items", items.len()),
        Value::Object(map) => describe_keys(map),
    }
}

/// An object by its keys, for a reason: `an object with keys "value", "extra"`.
fn describe_keys(map: &Map<String, Value>) -> String {
    if map.is_empty() {
        return "an empty object".to_owned();
    }
    let keys: Vec<String> = map.keys().take(OPTIONS_IN_REASON).map(|k| quote(k)).collect();
    let more = map.len().saturating_sub(OPTIONS_IN_REASON);
    let tail = if more == 0 { String::new() } else { format!(" and {more} more") };
    format!("an object with keys {}{tail}", keys.join(", "))
}

/// The values coerced writes set, in their (ascending id) order: a new row's cells, since a
/// `Clear` of a cell the row never had is nothing.
pub fn set_values(writes: &[(ColumnId, CellWrite)]) -> impl SortedCells + '_ {
    writes.iter().filter_map(|(id, write)| match write {
        CellWrite::Set(value) => Some((*id, value)),
        CellWrite::Clear => None,
    })
}

/// Apply coerced writes to a row's cells: `Set` stores the value, `Clear` removes the cell.
pub fn apply_writes(
    mut cells: BTreeMap<ColumnId, Json>,
    writes: Vec<(ColumnId, CellWrite)>,
) -> BTreeMap<ColumnId, Json> {
    for (col, write) in writes {
        match write {
            CellWrite::Clear => {
                cells.remove(&col);
            }
            CellWrite::Set(v) => {
                cells.insert(col, Json(v));
            }
        }
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ALL_TYPES: [ColumnType; 9] = [
        ColumnType::Text,
        ColumnType::Number,
        ColumnType::Checkbox,
        ColumnType::Date,
        ColumnType::Datetime,
        ColumnType::Contact,
        ColumnType::Dropdown,
        ColumnType::MultiSelect,
        ColumnType::Symbol,
    ];

    fn column(id: ColumnId, ty: ColumnType, options: Option<&[&str]>) -> Column {
        Column {
            id,
            sheet_id: 1,
            name: format!("c{id}"),
            ty,
            position: 0,
            options: options.map(|o| o.iter().map(|s| (*s).to_owned()).collect()),
            primary: false,
        }
    }

    fn col(ty: ColumnType) -> Column {
        let options: Option<&[&str]> =
            if ty.has_options() { Some(&["low", "high", "Zürich"]) } else { None };
        column(7, ty, options)
    }

    /// The stored value, panicking with the reason if refused.
    fn set(ty: ColumnType, raw: Value) -> Value {
        match coerce_cell(&col(ty), &raw) {
            Ok(CellWrite::Set(v)) => v,
            other => panic!("{ty:?} {raw}: expected Set, got {other:?}"),
        }
    }

    /// The reason, panicking if accepted.
    fn refused(ty: ColumnType, raw: Value) -> String {
        match coerce_cell(&col(ty), &raw) {
            Err(e) => {
                assert_eq!(e.column_id, 7);
                e.reason
            }
            Ok(w) => panic!("{ty:?} {raw}: expected a refusal, got {w:?}"),
        }
    }

    #[test]
    fn null_clears_every_type() {
        for ty in ALL_TYPES {
            assert_eq!(coerce_cell(&col(ty), &Value::Null), Ok(CellWrite::Clear));
        }
    }

    #[test]
    fn text_accepts_strings_numbers_booleans() {
        use ColumnType::Text;
        assert_eq!(set(Text, json!("hello")), json!("hello"));
        assert_eq!(set(Text, json!("")), json!(""));
        assert_eq!(set(Text, json!(12.5)), json!("12.5"));
        assert_eq!(set(Text, json!(12)), json!("12"));
        assert_eq!(set(Text, json!(-3)), json!("-3"));
        assert_eq!(set(Text, json!(true)), json!("true"));
        assert_eq!(set(Text, json!(false)), json!("false"));
    }

    #[test]
    fn text_limit_counts_chars_not_bytes() {
        use ColumnType::Text;
        let at_limit = "é".repeat(4000);
        assert_eq!(at_limit.len(), 8000);
        assert_eq!(set(Text, json!(at_limit)), json!(at_limit));
        let emoji = "🦀".repeat(4000);
        assert_eq!(set(Text, json!(emoji)), json!(emoji));
        let over = "é".repeat(4001);
        let reason = refused(Text, json!(over));
        assert!(reason.contains("4000") && reason.contains("4001"), "{reason}");
        refused(Text, json!("a".repeat(4001)));
    }

    #[test]
    fn text_refuses_lists_and_objects() {
        use ColumnType::Text;
        let reason = refused(Text, json!(["a"]));
        assert!(reason.contains("multi_select") && reason.contains("text column"), "{reason}");
        refused(Text, json!({"a": 1}));
    }

    #[test]
    fn number_accepts_numbers_and_decimal_strings() {
        use ColumnType::Number;
        let twelve = set(Number, json!(12));
        assert!(twelve.is_i64());
        assert_eq!(twelve, json!(12));
        assert_eq!(set(Number, json!(12.5)), json!(12.5));
        assert_eq!(set(Number, json!(u64::MAX)), json!(u64::MAX));
        assert_eq!(set(Number, json!(i64::MIN)), json!(i64::MIN));
        let from_string = set(Number, json!("12"));
        assert!(from_string.is_i64());
        assert_eq!(from_string, json!(12));
        assert_eq!(set(Number, json!("12.5")), json!(12.5));
        assert_eq!(set(Number, json!("-3.5")), json!(-3.5));
        assert_eq!(set(Number, json!("1e3")), json!(1000.0));
        assert_eq!(set(Number, json!("2.5E-1")), json!(0.25));
        assert_eq!(set(Number, json!("+7")), json!(7));
        assert_eq!(set(Number, json!(".5")), json!(0.5));
        assert_eq!(set(Number, json!("18446744073709551615")), json!(u64::MAX));
        assert_eq!(set(Number, json!("18446744073709551616")), json!(18446744073709551616.0));
    }

    #[test]
    fn number_refuses_non_decimals() {
        use ColumnType::Number;
        let reason = refused(Number, json!("abc"));
        assert!(reason.starts_with("expected a number"), "{reason}");
        assert!(reason.ends_with("got the string \"abc\""), "{reason}");
        for bad in ["", "abc", "NaN", "nan", "inf", "-inf", "infinity", "0x10", " 12", "12 ", "1,5"]
        {
            refused(Number, json!(bad));
        }
        for bad in ["1e", "e3", ".", "-", "1.2.3", "1e3.5", "12abc", "١٢"] {
            refused(Number, json!(bad));
        }
        let reason = refused(Number, json!("1e400"));
        assert!(reason.contains("too large"), "{reason}");
        refused(Number, json!(true));
        refused(Number, json!([1]));
    }

    #[test]
    fn checkbox_accepts_booleans_and_their_strings() {
        use ColumnType::Checkbox;
        assert_eq!(set(Checkbox, json!(true)), json!(true));
        assert_eq!(set(Checkbox, json!(false)), json!(false));
        assert_eq!(set(Checkbox, json!("true")), json!(true));
        assert_eq!(set(Checkbox, json!("false")), json!(false));
        for bad in [json!("TRUE"), json!("yes"), json!(""), json!(1), json!(0), json!([true])] {
            refused(Checkbox, bad);
        }
        assert!(refused(Checkbox, json!("yes")).contains("\"true\"/\"false\""));
    }

    #[test]
    fn date_accepts_real_calendar_dates() {
        use ColumnType::Date;
        assert_eq!(set(Date, json!("2026-01-31")), json!("2026-01-31"));
        assert_eq!(set(Date, json!("2024-02-29")), json!("2024-02-29"));
        assert_eq!(set(Date, json!("2000-02-29")), json!("2000-02-29"));
        assert_eq!(set(Date, json!("0001-01-01")), json!("0001-01-01"));
    }

    #[test]
    fn date_refuses_bad_dates() {
        use ColumnType::Date;
        let reason = refused(Date, json!("2025-02-29"));
        assert!(reason.contains("YYYY-MM-DD") && reason.contains("not a real calendar date"));
        for bad in [
            "2026-02-30",
            "1900-02-29",
            "2026-13-01",
            "2026-00-10",
            "2026-01-00",
            "2026-1-02",
            "26-01-02",
            "2026/01/02",
            "20260102",
            "2026-01-02T00:00:00Z",
            " 2026-01-02",
            "+2026-01-02",
            "２０２６-01-02",
            "",
        ] {
            refused(Date, json!(bad));
        }
        refused(Date, json!(20260102));
        refused(Date, json!(["2026-01-02"]));
    }

    #[test]
    fn datetime_normalizes_to_utc() {
        use ColumnType::Datetime;
        let cases = [
            ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05Z"),
            ("2026-01-02T03:04:05+00:00", "2026-01-02T03:04:05Z"),
            ("2026-01-02T03:04:05-00:00", "2026-01-02T03:04:05Z"),
            ("2026-01-02T03:04:05+01:00", "2026-01-02T02:04:05Z"),
            ("2026-01-02T03:04:05.120+01:00", "2026-01-02T02:04:05.120Z"),
            ("2026-01-02T03:04:05.5Z", "2026-01-02T03:04:05.5Z"),
            ("2026-01-02T03:04:05.123456789-05:30", "2026-01-02T08:34:05.123456789Z"),
            ("2025-12-31T23:30:00-01:00", "2026-01-01T00:30:00Z"),
            ("2026-01-01T00:30:00+01:00", "2025-12-31T23:30:00Z"),
            ("2024-02-28T23:00:00-02:00", "2024-02-29T01:00:00Z"),
            ("2026-01-02t03:04:05z", "2026-01-02T03:04:05Z"),
        ];
        for (sent, stored) in cases {
            assert_eq!(set(Datetime, json!(sent)), json!(stored), "{sent}");
        }
    }

    #[test]
    fn instants_parse_by_the_cell_rules() {
        assert_eq!(parse_instant("1970-01-01T00:00:01.5Z"), Ok(1500));
        assert_eq!(parse_instant("1970-01-01T01:00:00.123456789+01:00"), Ok(123));
        assert_eq!(parse_instant("2026-01-02t03:04:05z"), Ok(1_767_323_045_000));
        for refused in ["2026-01-02 03:04:05Z", "2026-01-02T23:59:60Z", "2026-01-02T03:04:05"] {
            assert!(parse_instant(refused).is_err(), "{refused}");
            assert!(normalize_datetime(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn datetime_refuses_bad_values() {
        use ColumnType::Datetime;
        let reason = refused(Datetime, json!("2026-01-02T03:04:05"));
        assert!(reason.contains("RFC 3339") && reason.contains("offset"), "{reason}");
        for bad in [
            "2026-01-02",
            "2026-01-02 03:04:05Z",
            "2026-01-02T03:04Z",
            "2026-02-30T03:04:05Z",
            "2025-02-29T03:04:05Z",
            "2026-01-02T24:00:00Z",
            "2026-01-02T03:60:00Z",
            "2026-01-02T23:59:60Z",
            "2026-01-02T03:04:05.Z",
            "2026-01-02T03:04:05.1234567890Z",
            "2026-01-02T03:04:05+24:00",
            "2026-01-02T03:04:05+01:60",
            "2026-01-02T03:04:05+0100",
            "2026-01-02T03:04:05+01",
            "2026-01-02T03:04:05ZZ",
            "2026-01-02T03:04:05Z ",
            "9999-12-31T23:59:59-01:00",
            "0000-01-01T00:00:00+01:00",
            "2026-01-02T03:04:05.1é+01:00",
            "",
        ] {
            refused(Datetime, json!(bad));
        }
        refused(Datetime, json!(1_767_225_600));
        refused(Datetime, json!(["2026-01-02T03:04:05Z"]));
    }

    #[test]
    fn contact_accepts_local_at_domain() {
        use ColumnType::Contact;
        for good in ["ada@example.com", "a@b", "first.last+tag@sub.example.org", "ü@ü.de"] {
            assert_eq!(set(Contact, json!(good)), json!(good));
        }
    }

    #[test]
    fn contact_refuses_malformed_addresses() {
        use ColumnType::Contact;
        let reason = refused(Contact, json!("ada"));
        assert!(reason.contains("local@domain"), "{reason}");
        for bad in [
            "",
            "ada",
            "@example.com",
            "ada@",
            "a@@b",
            "a@b@c",
            "a b@c",
            "a@b c",
            "a@b\t",
            "a@.b",
            "a@b.",
        ] {
            refused(Contact, json!(bad));
        }
        refused(Contact, json!(42));
        refused(Contact, json!(["a@b"]));
    }

    #[test]
    fn dropdown_and_symbol_accept_only_options() {
        for ty in [ColumnType::Dropdown, ColumnType::Symbol] {
            assert_eq!(set(ty, json!("low")), json!("low"));
            assert_eq!(set(ty, json!("Zürich")), json!("Zürich"));
            let reason = refused(ty, json!("medium"));
            assert!(reason.contains(r#"["low", "high", "Zürich"]"#), "{reason}");
            refused(ty, json!("LOW"));
            refused(ty, json!(""));
            refused(ty, json!(1));
            refused(ty, json!(["low"]));
            let bare = column(3, ty, None);
            let err = coerce_cell(&bare, &json!("low")).unwrap_err();
            assert_eq!(err.column_id, 3);
            assert!(err.reason.contains("no options"), "{}", err.reason);
            let empty = column(3, ty, Some(&[]));
            assert!(coerce_cell(&empty, &json!("low")).is_err());
        }
    }

    #[test]
    fn numeric_options_still_need_strings() {
        let ty = ColumnType::Dropdown;
        let numbered = column(4, ty, Some(&["1", "2"]));
        assert_eq!(coerce_cell(&numbered, &json!("1")), Ok(CellWrite::Set(json!("1"))));
        assert!(coerce_cell(&numbered, &json!(1)).is_err());
    }

    #[test]
    fn option_lists_in_reasons_are_cut() {
        let many: Vec<String> = (0..30).map(|i| format!("o{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let c = column(5, ColumnType::Dropdown, Some(&many));
        let reason = coerce_cell(&c, &json!("x")).unwrap_err().reason;
        assert!(reason.contains("\"o19\", … and 10 more"), "{reason}");
        assert!(!reason.contains("o20"), "{reason}");
    }

    #[test]
    fn multi_select_accepts_distinct_options() {
        use ColumnType::MultiSelect;
        assert_eq!(set(MultiSelect, json!(["low", "high"])), json!(["low", "high"]));
        assert_eq!(set(MultiSelect, json!(["high", "low"])), json!(["high", "low"]));
        assert_eq!(set(MultiSelect, json!("low")), json!(["low"]));
        assert_eq!(set(MultiSelect, json!([])), json!([]));
    }

    #[test]
    fn multi_select_refuses_duplicates_and_strangers() {
        use ColumnType::MultiSelect;
        let reason = refused(MultiSelect, json!(["low", "high", "low"]));
        assert!(reason.contains("item 2") && reason.contains("distinct"), "{reason}");
        let reason = refused(MultiSelect, json!(["low", "medium"]));
        assert!(reason.contains("item 1") && reason.contains("\"high\""), "{reason}");
        refused(MultiSelect, json!("medium"));
        refused(MultiSelect, json!(["low", 1]));
        refused(MultiSelect, json!([["low"]]));
        refused(MultiSelect, json!([null]));
        refused(MultiSelect, json!(1));
        refused(MultiSelect, json!(true));
        let bare = column(3, MultiSelect, None);
        assert_eq!(coerce_cell(&bare, &json!([])), Ok(CellWrite::Set(json!([]))));
        assert!(coerce_cell(&bare, &json!(["low"])).unwrap_err().reason.contains("no options"));
    }

    #[test]
    fn long_option_lists_are_checked_alike() {
        use ColumnType::MultiSelect;
        let many: Vec<String> = (0..=SCANNED_OPTIONS * 2).map(|i| format!("o{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let c = column(5, MultiSelect, Some(&many));
        let last = many[many.len() - 1];
        let ok = json!([last, "o0", "o3"]);
        assert_eq!(coerce_cell(&c, &ok), Ok(CellWrite::Set(ok.clone())));
        let reason = coerce_cell(&c, &json!(["o3", last, "o3"])).unwrap_err().reason;
        assert!(reason.contains("item 2") && reason.contains("distinct"), "{reason}");
        let reason = coerce_cell(&c, &json!(["o3", "x"])).unwrap_err().reason;
        assert!(reason.contains("item 1") && reason.contains("options"), "{reason}");
    }

    #[test]
    fn lists_are_only_for_multi_select() {
        for ty in ALL_TYPES {
            let raw = json!(["low"]);
            if ty == ColumnType::MultiSelect {
                assert_eq!(set(ty, raw), json!(["low"]));
            } else {
                assert!(refused(ty, raw).contains("only accepted by multi_select"));
                assert!(refused(ty, json!([])).contains("only accepted by multi_select"));
            }
        }
    }

    #[test]
    fn format_wrapper_coerces_its_value() {
        use ColumnType::{Datetime, Number, Text};
        assert_eq!(
            set(Number, json!({"value": "12", "format": "0.00"})),
            json!({"value": 12, "format": "0.00"})
        );
        assert_eq!(
            set(Text, json!({"value": 12.5, "format": "@"})),
            json!({"value": "12.5", "format": "@"})
        );
        assert_eq!(
            set(Datetime, json!({"value": "2026-01-02T03:04:05.120+01:00", "format": "iso"})),
            json!({"value": "2026-01-02T02:04:05.120Z", "format": "iso"})
        );
        assert_eq!(
            set(ColumnType::MultiSelect, json!({"value": ["low", "high"], "format": ""})),
            json!({"value": ["low", "high"], "format": ""})
        );
        assert_eq!(
            set(Number, json!({"value": null, "format": "0.00"})),
            json!({"value": null, "format": "0.00"})
        );
        let at_limit = "ü".repeat(256);
        assert_eq!(
            set(Number, json!({"value": 1, "format": at_limit})),
            json!({"value": 1, "format": at_limit})
        );
    }

    #[test]
    fn format_wrapper_refusals() {
        use ColumnType::{Number, Text};
        let reason = refused(Number, json!({"value": 1, "format": "ü".repeat(257)}));
        assert!(reason.contains("256") && reason.contains("257"), "{reason}");
        refused(Number, json!({"value": 1, "format": 2}));
        refused(Number, json!({"value": 1, "format": null}));
        refused(Number, json!({"format": "0.00"}));
        refused(Number, json!({"value": 1}));
        let reason = refused(Number, json!({"value": 1, "format": "x", "color": "red"}));
        assert!(reason.contains("\"color\"") && reason.contains("no other keys"), "{reason}");
        let reason = refused(Number, json!({"value": "abc", "format": "0.00"}));
        assert!(reason.contains("wrapper") && reason.contains("expected a number"), "{reason}");
        refused(Text, json!({"value": "é".repeat(4001), "format": "x"}));
        refused(Text, json!({"value": ["a"], "format": "x"}));
        let reason = refused(Number, json!({"value": {"value": 1, "format": "x"}, "format": "x"}));
        assert!(reason.contains("not another object"), "{reason}");
    }

    #[test]
    fn formula_wrapper_coerces_its_optional_value() {
        use ColumnType::{Checkbox, Number, Text};
        assert_eq!(
            set(Number, json!({"formula": "=A1+1", "value": "3"})),
            json!({"formula": "=A1+1", "value": 3})
        );
        assert_eq!(set(Text, json!({"formula": "=NOW()"})), json!({"formula": "=NOW()"}));
        assert_eq!(
            set(Checkbox, json!({"formula": "=TRUE()", "value": null})),
            json!({"formula": "=TRUE()", "value": null})
        );
        assert_eq!(set(Text, json!({"formula": "="})), json!({"formula": "="}));
    }

    #[test]
    fn formula_wrapper_refusals() {
        use ColumnType::{Number, Text};
        let reason = refused(Number, json!({"formula": "A1+1", "value": 3}));
        assert!(reason.contains("start with \"=\""), "{reason}");
        refused(Number, json!({"formula": "", "value": 3}));
        refused(Number, json!({"formula": " =A1"}));
        refused(Number, json!({"formula": 1}));
        refused(Number, json!({"formula": null}));
        refused(Number, json!({"formula": "=A1", "value": 3, "format": "x"}));
        refused(Number, json!({"formula": "=A1", "extra": 3}));
        refused(Number, json!({"formula": "=A1", "value": "abc"}));
        refused(Text, json!({"formula": "=A1", "value": {"formula": "=B1"}}));
    }

    #[test]
    fn other_object_shapes_are_refused() {
        for ty in ALL_TYPES {
            let reason = refused(ty, json!({}));
            assert!(reason.contains("empty object"), "{reason}");
            refused(ty, json!({"value": "low"}));
            refused(ty, json!({"Value": "low", "format": "x"}));
            refused(ty, json!({"foo": "bar"}));
        }
    }

    #[test]
    fn error_display_names_the_column() {
        let err = coerce_cell(&col(ColumnType::Number), &json!("abc")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "column 7: expected a number (a finite JSON number, or a string holding a decimal \
             such as \"12\", \"-3.5\" or \"1e3\"), got the string \"abc\""
        );
    }

    #[test]
    fn long_refused_strings_are_quoted_short() {
        let reason = refused(ColumnType::Number, json!("x".repeat(5000)));
        assert!(reason.contains("(5000 characters)") && reason.len() < 300, "{reason}");
    }

    #[test]
    fn operands_are_coerced_as_cells_and_unwrapped() {
        use ColumnType::{Datetime, MultiSelect, Number, Text};
        let operand = |ty, raw: Value| coerce_operand(&col(ty), &raw);
        assert_eq!(operand(Number, json!("5.0")), Ok(json!(5.0)));
        assert_eq!(
            operand(Datetime, json!("2026-03-01T12:00:00+02:00")),
            Ok(json!("2026-03-01T10:00:00Z"))
        );
        assert_eq!(operand(MultiSelect, json!("low")), Ok(json!(["low"])));
        assert_eq!(operand(Number, json!({"value": "7", "format": "0"})), Ok(json!(7)));
        assert_eq!(operand(Text, json!(" 2.5 ")), Ok(json!(" 2.5 ")));
        let refused = |ty, raw: Value| operand(ty, raw).unwrap_err().reason;
        assert!(refused(Number, json!(" 2.5 ")).starts_with("expected a number"));
        assert!(refused(Number, Value::Null).contains("null"));
        assert!(refused(Number, json!({"formula": "=A1"})).contains("without a value"));
        assert!(refused(Number, json!({"value": null, "format": "0"})).contains("without a value"));
    }

    #[test]
    fn stored_datetimes_order_by_instant() {
        use std::cmp::Ordering::{Equal, Greater, Less};
        let cmp = cmp_stored_datetimes;
        assert_eq!(cmp("2026-03-01T10:00:00Z", "2026-03-01T10:00:00.000Z"), Some(Equal));
        assert_eq!(cmp("2026-03-01T10:00:00.5Z", "2026-03-01T10:00:00Z"), Some(Greater));
        assert_eq!(cmp("2026-03-01T10:00:00.05Z", "2026-03-01T10:00:00.5Z"), Some(Less));
        assert_eq!(cmp("2026-03-01T09:59:59.999999999Z", "2026-03-01T10:00:00Z"), Some(Less));
        assert_eq!(cmp("0999-12-31T23:59:59Z", "1000-01-01T00:00:00Z"), Some(Less));
        for not_stored in [
            "2026-03-01T10:00:00+00:00",
            "2026-03-01T10:00:00",
            "2026-03-01T10:00:00.Z",
            "2026-03-01t10:00:00Z",
            "2026-03-01",
            "",
        ] {
            assert_eq!(cmp(not_stored, "2026-03-01T10:00:00Z"), None, "{not_stored}");
            assert_eq!(cmp("2026-03-01T10:00:00Z", not_stored), None, "{not_stored}");
        }
    }

    fn sheet() -> BTreeMap<ColumnId, Column> {
        [
            column(101, ColumnType::Text, None),
            column(102, ColumnType::Number, None),
            column(99, ColumnType::Checkbox, None),
        ]
        .into_iter()
        .map(|c| (c.id, c))
        .collect()
    }

    fn cells(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    /// Bulk writes coerce cells they own (values moved), everything else cells it borrows
    /// (values copied): the two must agree on every value and every refusal.
    #[test]
    fn owned_and_borrowed_cells_coerce_alike() {
        let columns: BTreeMap<ColumnId, Column> = ALL_TYPES
            .iter()
            .enumerate()
            .map(|(i, ty)| {
                let options = matches!(
                    ty,
                    ColumnType::Dropdown | ColumnType::MultiSelect | ColumnType::Symbol
                )
                .then_some(&["low", "high"][..]);
                let c = column(100 + i as u64, *ty, options);
                (c.id, c)
            })
            .collect();
        let samples = [
            json!("x"),
            json!(""),
            json!(12),
            json!(-3.5),
            json!("1e3"),
            json!(true),
            json!("true"),
            json!(null),
            json!("2026-01-31"),
            json!("2026-02-30"),
            json!("2026-01-02T03:04:05Z"),
            json!("2026-01-02T03:04:05.5+01:00"),
            json!("2026-01-02t03:04:05z"),
            json!("ada@example.com"),
            json!("low"),
            json!(["high", "low"]),
            json!(["low", "low"]),
            json!({"value": 1, "format": "0.0"}),
            json!({"formula": "=A1"}),
            json!({"other": 1}),
            json!([1]),
        ];
        for id in columns.keys() {
            for sample in &samples {
                let raw = cells(json!({ id.to_string(): sample }));
                assert_eq!(
                    coerce_owned_cells(&columns, raw.clone()),
                    coerce_cells(&columns, &raw),
                    "column {id}, {sample}"
                );
            }
        }
        let unknown = cells(json!({"100": "x", "07": 1, "9999": 2}));
        assert_eq!(coerce_owned_cells(&columns, unknown.clone()), coerce_cells(&columns, &unknown));
    }

    #[test]
    fn cells_come_back_in_column_id_order() {
        let raw = cells(json!({"102": "12", "101": 5, "99": null}));
        assert_eq!(
            coerce_cells(&sheet(), &raw),
            Ok(vec![
                (99, CellWrite::Clear),
                (101, CellWrite::Set(json!("5"))),
                (102, CellWrite::Set(json!(12))),
            ])
        );
        assert_eq!(coerce_cells(&sheet(), &Map::new()), Ok(vec![]));
    }

    #[test]
    fn unknown_column_ids_are_refused() {
        let err = coerce_cells(&sheet(), &cells(json!({"101": "a", "999": 1}))).unwrap_err();
        assert_eq!(
            err,
            CoerceError {
                column_id: CellKey::Column(999),
                reason: "no column with id 999 in this sheet".to_owned()
            }
        );
    }

    #[test]
    fn non_integer_keys_are_refused_naming_the_key_as_sent() {
        for key in
            ["abc", "", "-1", "+101", "0101", " 101", "101 ", "1.0", "1e2", "99999999999999999999"]
        {
            let mut raw = Map::new();
            raw.insert(key.to_owned(), json!(1));
            let err = coerce_cells(&sheet(), &raw).unwrap_err();
            assert_eq!(err.column_id, CellKey::Sent(key.to_owned()), "{key:?}");
            assert!(err.reason.starts_with("no column with id"), "{}", err.reason);
            assert!(err.reason.contains("decimal integers"), "{}", err.reason);
        }
        let err = coerce_cells(&sheet(), &cells(json!({"0": 1}))).unwrap_err();
        assert_eq!(err.column_id, 0);
        assert_eq!(err.reason, "no column with id 0 in this sheet");
        // The detail shows an id as an integer and a key as sent as a string.
        assert_eq!(serde_json::to_value(CellKey::Column(7)).unwrap(), json!(7));
        assert_eq!(serde_json::to_value(CellKey::Sent("+7".into())).unwrap(), json!("+7"));
    }

    #[test]
    fn cells_report_the_first_failure_in_key_order() {
        // serde_json's default map iterates keys in sorted (string) order: "101" < "102" < "99".
        let raw = cells(json!({"99": "maybe", "102": "abc", "101": "ok"}));
        let err = coerce_cells(&sheet(), &raw).unwrap_err();
        assert_eq!(err.column_id, 102);
        assert!(err.reason.starts_with("expected a number"), "{}", err.reason);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        const OPTIONS: [&str; 5] = ["low", "high", "Zürich", "", "1"];

        /// Strings near or inside the accepted forms of each type, so accept paths are common.
        fn interesting_string() -> impl Strategy<Value = String> {
            prop_oneof![
                prop::sample::select(&OPTIONS[..]).prop_map(str::to_owned),
                prop::sample::select(&["true", "false", "TRUE", "NaN", "inf", "0x10"][..])
                    .prop_map(str::to_owned),
                "[+-]?[0-9]{0,25}(\\.[0-9]{0,5})?([eE][+-]?[0-9]{1,4})?",
                "-?[0-9]{1,6}(\\.[0-9]{1,3})?",
                "[0-9]{4}-[0-1][0-9]-[0-3][0-9]",
                "[0-9]{4}-[01][0-9]-[0-3][0-9][Tt ][0-2][0-9]:[0-6][0-9]:[0-6][0-9](\\.[0-9]{0,11})?([Zz]|[+-][0-2][0-9]:[0-6][0-9])?",
                valid_date(),
                valid_datetime(),
                valid_datetime(),
                "[a-zé .]{0,4}@[a-z.@ ]{0,5}",
                "[a-z]{1,5}(\\.[a-z]{1,5})?@[a-z]{1,5}(\\.[a-z]{2,3})?",
                "=?[A-Z0-9+()]{0,6}",
                (3995usize..4005).prop_map(|n| "é".repeat(n)),
            ]
        }

        fn valid_date() -> impl Strategy<Value = String> {
            (0i32..=9999, 1u32..=12, 1u32..=31).prop_filter_map("real date", |(y, m, d)| {
                NaiveDate::from_ymd_opt(y, m, d).map(|_| format!("{y:04}-{m:02}-{d:02}"))
            })
        }

        fn valid_datetime() -> impl Strategy<Value = String> {
            let offset = prop_oneof![
                Just("Z".to_owned()),
                Just("z".to_owned()),
                (prop::bool::ANY, 0u32..24, 0u32..60).prop_map(|(neg, h, m)| {
                    format!("{}{h:02}:{m:02}", if neg { '-' } else { '+' })
                }),
            ];
            (valid_date(), 0u32..24, 0u32..60, 0u32..60, "(\\.[0-9]{1,9})?", offset).prop_map(
                |(date, h, m, s, fraction, offset)| {
                    format!("{date}T{h:02}:{m:02}:{s:02}{fraction}{offset}")
                },
            )
        }

        fn key() -> impl Strategy<Value = String> {
            prop_oneof![
                3 => prop::sample::select(&["value", "format", "formula"][..]).prop_map(str::to_owned),
                1 => "[a-z]{0,6}",
                1 => any::<String>(),
            ]
        }

        /// Arbitrary JSON: scalars, typed strings, nested lists and objects (with wrapper keys
        /// common among the random ones), well-shaped wrappers, and lists of options.
        fn arb_json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                1 => Just(Value::Null),
                1 => any::<bool>().prop_map(Value::Bool),
                1 => any::<i64>().prop_map(Value::from),
                1 => any::<u64>().prop_map(Value::from),
                1 => any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
                1 => (-1000i64..1000).prop_map(Value::from),
                2 => any::<String>().prop_map(Value::String),
                8 => interesting_string().prop_map(Value::String),
            ];
            let nested = leaf.clone().prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::vec((key(), inner), 0..4)
                        .prop_map(|entries| Value::Object(entries.into_iter().collect())),
                ]
            });
            let option_list = prop::collection::vec(prop::sample::select(&OPTIONS[..]), 0..5)
                .prop_map(|items| serde_json::json!(items));
            let wrapped =
                prop_oneof![4 => leaf.clone(), 1 => option_list.clone(), 1 => nested.clone()];
            let format_string =
                prop_oneof!["[#0.,@a-z]{0,8}", (250usize..260).prop_map(|n| "ü".repeat(n))];
            let formula = prop_oneof!["=[A-Z0-9+]{0,6}", "[A-Z0-9+]{0,6}"];
            prop_oneof![
                6 => leaf,
                3 => nested,
                2 => option_list,
                2 => (wrapped.clone(), format_string)
                    .prop_map(|(value, format)| serde_json::json!({"value": value, "format": format})),
                2 => (wrapped, formula.clone())
                    .prop_map(|(value, formula)| serde_json::json!({"formula": formula, "value": value})),
                1 => formula.prop_map(|formula| serde_json::json!({"formula": formula})),
            ]
        }

        /// Every type, each with no options, an empty list of options and a real one.
        fn every_column() -> Vec<Column> {
            let option_sets: [Option<&[&str]>; 3] = [None, Some(&[]), Some(&OPTIONS)];
            ALL_TYPES
                .iter()
                .flat_map(|ty| option_sets.iter().map(move |options| column(42, *ty, *options)))
                .collect()
        }

        fn check(column: &Column, raw: &Value) -> Result<(), TestCaseError> {
            match coerce_cell(column, raw) {
                Ok(CellWrite::Clear) => prop_assert!(raw.is_null()),
                Ok(CellWrite::Set(stored)) => {
                    prop_assert!(!stored.is_null());
                    prop_assert_eq!(
                        coerce_cell(column, &stored),
                        Ok(CellWrite::Set(stored.clone())),
                        "{:?} not idempotent on {} (from {})",
                        column.ty,
                        stored,
                        raw
                    );
                }
                Err(e) => {
                    prop_assert_eq!(e.column_id, 42);
                    prop_assert!(!e.reason.is_empty());
                }
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 2048,
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            /// `coerce_cell` never panics, and what it stores is stored again unchanged.
            #[test]
            fn coerce_cell_is_total_and_idempotent(raw in arb_json()) {
                for column in every_column() {
                    check(&column, &raw)?;
                }
            }

            /// The same with random option lists.
            #[test]
            fn random_options(
                ty in prop::sample::select(&ALL_TYPES[..]),
                options in prop::option::of(prop::collection::vec(
                    prop_oneof![interesting_string(), any::<String>()], 0..5)),
                raw in arb_json(),
            ) {
                let options: Option<Vec<&str>> =
                    options.as_ref().map(|o| o.iter().map(String::as_str).collect());
                check(&column(42, ty, options.as_deref()), &raw)?;
            }

            /// `coerce_cells` never panics and keeps its promises on any cells object.
            #[test]
            fn coerce_cells_is_total(
                entries in prop::collection::vec(
                    (prop_oneof!["(0|[1-9][0-9]{0,3})", any::<String>(), Just("101".to_owned())],
                     arb_json()),
                    0..6),
            ) {
                let raw: Map<String, Value> = entries.into_iter().collect();
                match coerce_cells(&sheet(), &raw) {
                    Ok(writes) => {
                        prop_assert_eq!(writes.len(), raw.len());
                        prop_assert!(writes.windows(2).all(|w| w[0].0 < w[1].0));
                    }
                    Err(e) => prop_assert!(!e.reason.is_empty()),
                }
            }
        }
    }
}
