//! One description of every counter: each stats struct visits its numbers
//! once — name, kind, unit, help, value — and every output (the JSON and
//! human reports of `qr`, its `/metrics`, the C API's coverage test) is
//! generated from that visit, so a counter added to a struct appears
//! everywhere with no second list to forget.
//!
//! A vocabulary only: it depends on nothing, so every layer may use it.

/// Whether a value only grows (a counter) or goes up and down (a gauge):
/// Prometheus types and names them differently (`_total` on counters only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Monotonically increasing since the struct was created.
    Counter,
    /// A current level (a size, a number of live things).
    Gauge,
}

/// The base unit of a value, as Prometheus names suffix it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A count of things (packets, events, work requests).
    Count,
    /// Bytes (`_bytes`).
    Bytes,
    /// Seconds (`_seconds`).
    Seconds,
}

/// One visited value.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// A sub-record the value belongs to (`drops`): the JSON reports nest it
    /// under this key, Prometheus joins it into the name. `None` for most.
    pub group: Option<&'static str>,
    /// The name inside its group, snake case, without unit or `_total`
    /// suffix beyond what the name already says (`sent_bytes`).
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// Base unit.
    pub unit: Unit,
    /// One line for humans (Prometheus `# HELP`).
    pub help: &'static str,
    /// The value now.
    pub value: u64,
}

/// A stats struct whose numbers can be listed: implement [`Counters::visit`]
/// once and every output follows.
pub trait Counters {
    /// Call `f` once per value, in a stable order.
    fn visit(&self, f: &mut dyn FnMut(Metric));
}

/// A field [`visit_fields!`](crate::visit_fields) can read: counters are
/// `u64`; gauges may be kept signed (a level updated by `+1`/`-1` from
/// several tasks can dip below zero for a moment), and read as 0 then.
pub trait FieldValue {
    /// The value to report.
    fn value(&self) -> u64;
}

impl FieldValue for u64 {
    fn value(&self) -> u64 {
        *self
    }
}

impl FieldValue for i64 {
    fn value(&self) -> u64 {
        u64::try_from(*self).unwrap_or(0)
    }
}

/// Live counters kept as atomics (read relaxed: a report is a moment's
/// view, not a synchronisation point), so a struct of atomics can visit its
/// fields directly instead of copying them into a snapshot first.
impl FieldValue for std::sync::atomic::AtomicU64 {
    fn value(&self) -> u64 {
        self.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Helper for `visit` implementations: one line per field,
/// `field: Kind, Unit, "help";` or `field => name: ...` where the public name
/// differs from the field's. The name comes from the field itself so the two
/// cannot drift apart.
#[macro_export]
#[doc(hidden)]
macro_rules! visit_fields {
    ($f:expr, $s:expr, $group:expr;
     $($field:ident $(=> $name:ident)?: $kind:ident, $unit:ident, $help:literal;)*) => {
        $(
            $f($crate::counters::Metric {
                group: $group,
                name: $crate::visit_fields!(@name $field $($name)?),
                kind: $crate::counters::Kind::$kind,
                unit: $crate::counters::Unit::$unit,
                help: $help,
                value: $crate::counters::FieldValue::value(&$s.$field),
            });
        )*
    };
    (@name $field:ident) => { stringify!($field) };
    (@name $field:ident $name:ident) => { stringify!($name) };
}
