//! Task filters and sorting as `GET /projects/{id}/tasks` takes them
//! (`task_collection_filter.go`, `task_search.go`,
//! `task_collection_sort.go`):
//!
//! - `filter`: `field op value` conditions joined with `&&` or `||` and
//!   grouped with `( )`, combined strictly left to right as Vikunja folds
//!   them (`a || b && c` is `(a || b) && c`). Operators `=`, `!=`, `>`,
//!   `>=`, `<`, `<=`, `like` (also `~`: contains, ASCII case-insensitive
//!   as on SQLite), `in` and `not in` (comma-separated values). A value
//!   runs up to the next `&`, `|`, `(` or `)` and is trimmed, or is
//!   quoted with `'` or `"`. Dates are datemath (`now`, `now-1h`,
//!   `now/d`, `2026-08-01||+1d`), else RFC 3339, else `2006-01-02 15:04`,
//!   else `2006-01-02`, all in UTC. An unset date is SQL `NULL`: no
//!   comparison matches it, unless `filter_include_nulls=true` (which
//!   also matches 0 for integer fields). `project` is `project_id`.
//! - `sort_by`/`order_by` pairs by position (`asc` by default), unset
//!   dates last either way, and `id asc` appended unless the last sort
//!   is by `id`.
//!
//! Fields: `id`, `index`, `title`, `description`, `done`, `done_at`,
//! `due_date`, `start_date`, `end_date`, `created`, `updated`,
//! `priority`, `percent_done`, `hex_color`, `project_id`,
//! `created_by_id`, `repeat_after`. Vikunja's `assignees`, `labels`,
//! `reminders`, `uid`, `bucket_id` and `position` are refused as not
//! implemented; anything else is Vikunja's 400 4016.

use std::cmp::Ordering;

use axum::http::StatusCode;
use time::format_description::well_known::Rfc3339;
use time::{Date, Duration, Month, OffsetDateTime, PrimitiveDateTime, Time};

use super::TaskRec;
use super::ops::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Id,
    Index,
    Title,
    Description,
    Done,
    DoneAt,
    DueDate,
    StartDate,
    EndDate,
    Created,
    Updated,
    Priority,
    PercentDone,
    HexColor,
    ProjectId,
    CreatedById,
    RepeatAfter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Float,
    Str,
    Bool,
    Date,
}

impl Field {
    /// A field `validateTaskFieldForSorting` accepts, or its error.
    fn named(name: &str) -> Result<Self, ApiError> {
        Ok(match name {
            "id" => Self::Id,
            "index" => Self::Index,
            "title" => Self::Title,
            "description" => Self::Description,
            "done" => Self::Done,
            "done_at" => Self::DoneAt,
            "due_date" => Self::DueDate,
            "start_date" => Self::StartDate,
            "end_date" => Self::EndDate,
            "created" => Self::Created,
            "updated" => Self::Updated,
            "priority" => Self::Priority,
            "percent_done" => Self::PercentDone,
            "hex_color" => Self::HexColor,
            "project_id" => Self::ProjectId,
            "created_by_id" => Self::CreatedById,
            "repeat_after" => Self::RepeatAfter,
            "uid" | "bucket_id" | "position" => {
                return Err(ApiError::not_implemented(format!(
                    "the task field `{name}` in sorting or filtering"
                )));
            }
            _ => return Err(invalid_field(name)),
        })
    }

    fn kind(self) -> Kind {
        match self {
            Self::Id
            | Self::Index
            | Self::Priority
            | Self::ProjectId
            | Self::CreatedById
            | Self::RepeatAfter => Kind::Int,
            Self::PercentDone => Kind::Float,
            Self::Title | Self::Description | Self::HexColor => Kind::Str,
            Self::Done => Kind::Bool,
            Self::DoneAt
            | Self::DueDate
            | Self::StartDate
            | Self::EndDate
            | Self::Created
            | Self::Updated => Kind::Date,
        }
    }

    fn value(self, t: &TaskRec) -> Val {
        match self {
            Self::Id => Val::Int(t.id),
            Self::Index => Val::Int(t.index),
            Self::Priority => Val::Int(t.priority),
            Self::ProjectId => Val::Int(t.project_id),
            Self::CreatedById => Val::Int(t.created_by),
            Self::RepeatAfter => Val::Int(0),
            Self::PercentDone => Val::Float(t.percent_done),
            Self::Title => Val::Str(t.title.clone()),
            Self::Description => Val::Str(t.description.clone()),
            Self::HexColor => Val::Str(t.hex_color.clone()),
            Self::Done => Val::Bool(t.done),
            Self::DoneAt => Val::Date(t.done_at),
            Self::DueDate => Val::Date(t.due_date),
            Self::StartDate => Val::Date(t.start_date),
            Self::EndDate => Val::Date(t.end_date),
            Self::Created => Val::Date(Some(t.created)),
            Self::Updated => Val::Date(Some(t.updated)),
        }
    }
}

fn invalid_field(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        4016,
        format!("The task field '{name}' is invalid."),
    )
}

/// A field's value; an unset date is `Date(None)`, SQL `NULL`.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    Date(Option<OffsetDateTime>),
}

impl Val {
    fn is_null(&self) -> bool {
        matches!(self, Self::Date(None))
    }

    /// SQL ordering of two non-null values of one field.
    fn order(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Self::Int(a), Self::Int(b)) => a.cmp(b),
            (Self::Float(a), Self::Float(b)) => a.partial_cmp(b).unwrap_or(Ordering::Equal),
            (Self::Str(a), Self::Str(b)) => a.as_bytes().cmp(b.as_bytes()),
            (Self::Bool(a), Self::Bool(b)) => a.cmp(b),
            (Self::Date(a), Self::Date(b)) => a.cmp(b),
            _ => Ordering::Equal,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Eq,
    Neq,
    Gt,
    Gte,
    Lt,
    Lte,
    Like,
    In,
    NotIn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    And,
    Or,
}

#[derive(Debug, Clone)]
enum Node {
    Cond {
        field: Field,
        cmp: Cmp,
        values: Vec<Val>,
    },
    Group(Vec<(Join, Node)>),
}

/// A parsed `filter`.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    items: Vec<(Join, Node)>,
    include_nulls: bool,
}

impl Filter {
    /// Parses `filter` (empty is none), with `now` for datemath.
    pub(crate) fn parse(
        filter: &str,
        include_nulls: bool,
        now: OffsetDateTime,
    ) -> Result<Option<Self>, ApiError> {
        if filter.trim().is_empty() {
            return Ok(None);
        }
        let mut parser = Parser {
            text: filter,
            pos: 0,
            now,
        };
        let items = parser.group(0)?;
        if parser.pos < filter.len() {
            return Err(parser.invalid("unexpected `)`"));
        }
        Ok(Some(Self {
            items,
            include_nulls,
        }))
    }

    /// Whether task `t` passes.
    pub(crate) fn matches(&self, t: &TaskRec) -> bool {
        self.fold(&self.items, t)
    }

    fn fold(&self, items: &[(Join, Node)], t: &TaskRec) -> bool {
        let mut result = None;
        for (join, node) in items {
            let this = match node {
                Node::Group(inner) => self.fold(inner, t),
                Node::Cond { field, cmp, values } => self.test(*field, *cmp, values, t),
            };
            result = Some(match (result, join) {
                (None, _) => this,
                (Some(r), Join::And) => r && this,
                (Some(r), Join::Or) => r || this,
            });
        }
        result.unwrap_or(true)
    }

    fn test(&self, field: Field, cmp: Cmp, values: &[Val], t: &TaskRec) -> bool {
        let v = field.value(t);
        let matched = !v.is_null()
            && match cmp {
                Cmp::Eq => values
                    .first()
                    .is_some_and(|x| v.order(x).is_eq() && !x.is_null()),
                Cmp::Neq => values
                    .first()
                    .is_some_and(|x| !v.order(x).is_eq() && !x.is_null()),
                Cmp::Gt => values.first().is_some_and(|x| v.order(x).is_gt()),
                Cmp::Gte => values.first().is_some_and(|x| v.order(x).is_ge()),
                Cmp::Lt => values.first().is_some_and(|x| v.order(x).is_lt()),
                Cmp::Lte => values.first().is_some_and(|x| v.order(x).is_le()),
                Cmp::Like => match (&v, values.first()) {
                    (Val::Str(s), Some(Val::Str(needle))) => s
                        .to_ascii_lowercase()
                        .contains(&needle.to_ascii_lowercase()),
                    _ => false,
                },
                Cmp::In => values.iter().any(|x| v.order(x).is_eq()),
                Cmp::NotIn => !values.iter().any(|x| v.order(x).is_eq()),
            };
        if !self.include_nulls {
            return matched;
        }
        // getFilterCond: `OR field IS NULL`, and `OR field = 0` for a
        // plain comparison on an int64 field.
        let numeric = field.kind() == Kind::Int && !matches!(cmp, Cmp::In | Cmp::NotIn);
        matched || v.is_null() || (numeric && v == Val::Int(0))
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    now: OffsetDateTime,
}

impl Parser<'_> {
    fn invalid(&self, why: &str) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            4024,
            format!(
                "The filter expression '{}' is invalid: {why} at position {}",
                self.text, self.pos
            ),
        )
    }

    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn skip_space(&mut self) -> usize {
        let start = self.pos;
        while self.rest().starts_with(char::is_whitespace) {
            let c = self.rest().chars().next().map_or(1, char::len_utf8);
            self.pos += c;
        }
        self.pos - start
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    /// Items up to the end, or up to the `)` closing a group at `depth`.
    fn group(&mut self, depth: usize) -> Result<Vec<(Join, Node)>, ApiError> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            let join = if items.is_empty() {
                Join::And
            } else {
                if self.rest().is_empty() || (depth > 0 && self.rest().starts_with(')')) {
                    break;
                }
                if self.eat("&&") {
                    Join::And
                } else if self.eat("||") {
                    Join::Or
                } else {
                    return Err(self.invalid("expected && or ||"));
                }
            };
            self.skip_space();
            if self.eat("(") {
                let inner = self.group(depth + 1)?;
                self.skip_space();
                if !self.eat(")") {
                    return Err(self.invalid("expected `)`"));
                }
                items.push((join, Node::Group(inner)));
            } else {
                items.push((join, self.condition()?));
            }
        }
        Ok(items)
    }

    fn condition(&mut self) -> Result<Node, ApiError> {
        let start = self.pos;
        while self
            .rest()
            .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        {
            self.pos += 1;
        }
        let name = &self.text[start..self.pos];
        if name.is_empty() {
            return Err(self.invalid("expected a field name"));
        }
        let spaced = self.skip_space() > 0;
        let word = |p: &mut Self, w: &str| {
            let r = p.rest();
            if spaced && r.starts_with(w) && r[w.len()..].starts_with(char::is_whitespace) {
                p.pos += w.len();
                true
            } else {
                false
            }
        };
        let cmp = if word(self, "not in") || self.eat("?!=") {
            Cmp::NotIn
        } else if word(self, "in") || self.eat("?=") {
            Cmp::In
        } else if word(self, "like") || self.eat("~") {
            Cmp::Like
        } else if self.eat(">=") {
            Cmp::Gte
        } else if self.eat("<=") {
            Cmp::Lte
        } else if self.eat("!=") {
            Cmp::Neq
        } else if self.eat("=") {
            Cmp::Eq
        } else if self.eat(">") {
            Cmp::Gt
        } else if self.eat("<") {
            Cmp::Lt
        } else {
            return Err(self.invalid(&format!("expected an operator after `{name}`")));
        };
        self.skip_space();
        let raw = self.value()?;
        let name = if name == "project" {
            "project_id"
        } else {
            name
        };
        let field = match name {
            "assignees" | "labels" | "reminders" => {
                return Err(ApiError::not_implemented(format!("filtering on `{name}`")));
            }
            _ => Field::named(name)?,
        };
        let bad_value = || {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                4019,
                format!("The task filter value '{raw}' for field '{name}' is invalid."),
            )
        };
        if cmp == Cmp::Like && field.kind() != Kind::Str {
            return Err(bad_value());
        }
        let parts: Vec<&str> = if matches!(cmp, Cmp::In | Cmp::NotIn) {
            raw.split(',').collect()
        } else {
            vec![raw.as_str()]
        };
        let mut values = Vec::new();
        for part in parts {
            values.push(native(field.kind(), part, self.now).ok_or_else(bad_value)?);
        }
        Ok(Node::Cond { field, cmp, values })
    }

    /// A quoted value, or the text up to the next `&`, `|`, `(` or `)`,
    /// trimmed.
    fn value(&mut self) -> Result<String, ApiError> {
        if let Some(quote) = self
            .rest()
            .chars()
            .next()
            .filter(|c| *c == '\'' || *c == '"')
        {
            let mut out = String::new();
            let mut chars = self.rest()[1..].char_indices();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            out.push(escaped);
                        }
                    }
                    c if c == quote => {
                        self.pos += 1 + i + c.len_utf8();
                        self.skip_space();
                        return Ok(out);
                    }
                    c => out.push(c),
                }
            }
            // An unclosed quote is an ordinary character, as Vikunja
            // treats it.
        }
        let end = self
            .rest()
            .find(['&', '|', '(', ')'])
            .unwrap_or(self.rest().len());
        let raw = self.rest()[..end].trim().to_string();
        if raw.is_empty() {
            return Err(self.invalid("expected a value"));
        }
        self.pos += end;
        Ok(raw)
    }
}

/// `raw` as a value of `kind`, as `getValueForField` casts it.
fn native(kind: Kind, raw: &str, now: OffsetDateTime) -> Option<Val> {
    let raw = raw.trim();
    Some(match kind {
        Kind::Int => Val::Int(raw.parse().ok()?),
        Kind::Float => Val::Float(raw.parse().ok()?),
        Kind::Str => Val::Str(raw.to_string()),
        Kind::Bool => Val::Bool(match raw {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => true,
            "0" | "f" | "F" | "FALSE" | "false" | "False" => false,
            _ => return None,
        }),
        Kind::Date => Val::Date(Some(datemath(raw, now).or_else(|| user_time(raw))?)),
    })
}

/// A datemath expression (`go-datemath`): `now` or `<date>||`, then
/// `+N<unit>`, `-N<unit>` and `/<unit>` (rounding down), units `y`, `M`,
/// `w`, `d`, `h`/`H`, `m`, `s`; in UTC, weeks starting on Monday.
fn datemath(raw: &str, now: OffsetDateTime) -> Option<OffsetDateTime> {
    let (mut t, mut ops) = if let Some(ops) = raw.strip_prefix("now") {
        (now, ops)
    } else if let Some((anchor, ops)) = raw.split_once("||") {
        (user_time(anchor)?, ops)
    } else {
        return None;
    };
    while let Some(op) = ops.chars().next() {
        ops = &ops[op.len_utf8()..];
        match op {
            '+' | '-' => {
                let digits = ops.len() - ops.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let n: i64 = ops[..digits].parse().ok()?;
                ops = &ops[digits..];
                let unit = ops.chars().next()?;
                ops = &ops[unit.len_utf8()..];
                t = shift(t, if op == '-' { -n } else { n }, unit)?;
            }
            '/' => {
                let unit = ops.chars().next()?;
                ops = &ops[unit.len_utf8()..];
                t = round_down(t, unit)?;
            }
            _ => return None,
        }
    }
    Some(t)
}

fn shift(t: OffsetDateTime, n: i64, unit: char) -> Option<OffsetDateTime> {
    Some(match unit {
        'y' => add_months(t, n.checked_mul(12)?)?,
        'M' => add_months(t, n)?,
        'w' => t.checked_add(Duration::weeks(n))?,
        'd' => t.checked_add(Duration::days(n))?,
        'h' | 'H' => t.checked_add(Duration::hours(n))?,
        'm' => t.checked_add(Duration::minutes(n))?,
        's' => t.checked_add(Duration::seconds(n))?,
        _ => return None,
    })
}

/// `t` moved by `months` as Go's `AddDate` does: a day past the end of
/// the month runs into the next (31 January + 1 month is 3 March).
fn add_months(t: OffsetDateTime, months: i64) -> Option<OffsetDateTime> {
    let total = i64::from(t.year()) * 12 + i64::from(u8::from(t.month())) - 1 + months;
    let year = i32::try_from(total.div_euclid(12)).ok()?;
    let month = Month::try_from(u8::try_from(total.rem_euclid(12) + 1).ok()?).ok()?;
    let first = Date::from_calendar_date(year, month, 1).ok()?;
    let date = first.checked_add(Duration::days(i64::from(t.day()) - 1))?;
    Some(t.replace_date(date))
}

fn round_down(t: OffsetDateTime, unit: char) -> Option<OffsetDateTime> {
    let midnight = t.replace_time(Time::MIDNIGHT);
    Some(match unit {
        'y' => midnight.replace_date(Date::from_calendar_date(t.year(), Month::January, 1).ok()?),
        'M' => midnight.replace_date(Date::from_calendar_date(t.year(), t.month(), 1).ok()?),
        'w' => midnight.checked_sub(Duration::days(i64::from(
            t.weekday().number_days_from_monday(),
        )))?,
        'd' => midnight,
        'h' | 'H' => t.replace_time(Time::from_hms(t.hour(), 0, 0).ok()?),
        'm' => t.replace_time(Time::from_hms(t.hour(), t.minute(), 0).ok()?),
        's' => t.replace_nanosecond(0).ok()?,
        _ => return None,
    })
}

/// `parseTimeFromUserInput`: RFC 3339, `2006-01-02 15:04`, `2006-01-02`,
/// then a loose `Y-M-D` (`2022-11-1`); zone-less ones in UTC.
fn user_time(raw: &str) -> Option<OffsetDateTime> {
    if let Ok(t) = OffsetDateTime::parse(raw, &Rfc3339) {
        return Some(t.to_offset(time::UtcOffset::UTC));
    }
    let minute = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]");
    if let Ok(t) = PrimitiveDateTime::parse(raw, &minute) {
        return Some(t.assume_utc());
    }
    let parts: Vec<&str> = raw.split('-').collect();
    if parts.len() < 3 {
        return None;
    }
    let year: i32 = parts[0].parse().ok()?;
    let month: u8 = parts[1].parse().ok()?;
    let day: u8 = parts[2].parse().ok()?;
    let date = Date::from_calendar_date(year, Month::try_from(month).ok()?, day).ok()?;
    Some(date.midnight().assume_utc())
}

/// A parsed `sort_by`/`order_by`.
#[derive(Debug, Clone)]
pub(crate) struct Sort(Vec<(Field, bool)>);

impl Sort {
    /// Pairs `sort_by` with `order_by` by position, checking each as
    /// `sortParam.validate` does (the order first, then the field).
    pub(crate) fn parse(sort_by: &[String], order_by: &[String]) -> Result<Self, ApiError> {
        let mut keys = Vec::new();
        for (i, name) in sort_by.iter().enumerate() {
            let desc = match order_by.get(i).map(String::as_str) {
                None | Some("asc") => false,
                Some("desc") => true,
                Some(_) => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        4014,
                        "The task sort order 'invalid' is invalid. Allowed is either asc or desc.",
                    ));
                }
            };
            // Relevance needs a search (`s`), which the stand-in does
            // not have; without one Vikunja skips it.
            if name == "relevance" {
                continue;
            }
            keys.push((Field::named(name)?, desc));
        }
        if keys.last().is_none_or(|(f, _)| *f != Field::Id) {
            keys.push((Field::Id, false));
        }
        Ok(Self(keys))
    }

    /// How `a` and `b` are ordered: unset dates last (`NULLS LAST`).
    pub(crate) fn compare(&self, a: &TaskRec, b: &TaskRec) -> Ordering {
        for (field, desc) in &self.0 {
            let (va, vb) = (field.value(a), field.value(b));
            let o = match (va.is_null(), vb.is_null()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) if *desc => vb.order(&va),
                (false, false) => va.order(&vb),
            };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn at(s: &str) -> OffsetDateTime {
        OffsetDateTime::parse(s, &Rfc3339).unwrap()
    }

    #[test]
    fn datemath_follows_go_datemath() {
        let now = at("2026-01-31T15:45:30Z");
        assert_eq!(datemath("now", now), Some(now));
        assert_eq!(datemath("now-1h", now), Some(at("2026-01-31T14:45:30Z")));
        assert_eq!(datemath("now/d", now), Some(at("2026-01-31T00:00:00Z")));
        assert_eq!(datemath("now+1M", now), Some(at("2026-03-03T15:45:30Z")));
        assert_eq!(datemath("now-1d/w", now), Some(at("2026-01-26T00:00:00Z")));
        assert_eq!(
            datemath("2026-08-01||+1d", now),
            Some(at("2026-08-02T00:00:00Z"))
        );
        assert_eq!(datemath("2026-08-01", now), None);
        assert_eq!(datemath("now-x", now), None);
    }

    #[test]
    fn user_times_parse_as_vikunja_parses_them() {
        assert_eq!(
            user_time("2026-08-01T12:00:00+02:00"),
            Some(at("2026-08-01T10:00:00Z"))
        );
        assert_eq!(
            user_time("2026-08-01 10:30"),
            Some(at("2026-08-01T10:30:00Z"))
        );
        assert_eq!(user_time("2022-11-1"), Some(at("2022-11-01T00:00:00Z")));
        // A `+` the client did not encode arrives as a space.
        assert_eq!(user_time("2026-08-01T12:00:00 02:00"), None);
    }
}
