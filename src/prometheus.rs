//! The Prometheus text exposition format (version 0.0.4), as `GET /admin/v1/metrics` serves it.
//!
//! A small writer rather than a metrics library: the server already keeps its counters (request
//! counts and latencies in [`crate::metrics`], flush statistics in [`actors::WalStats`], sizes in
//! the domain), so exporting them is a matter of formatting one snapshot per scrape
//! ([`crate::metrics::exposition`] says what is exported; this module only how). Each family
//! gets its `# HELP` and `# TYPE` lines once, before its samples; histograms take cumulative
//! bucket counts and add the `+Inf` bucket, `_sum` and `_count`.

use std::fmt::Write;

/// The `Content-Type` of the format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An exposition being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

/// Label pairs of one sample.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ =
            writeln!(self.out, "# HELP {name} {}", help.replace('\\', "\\\\").replace('\n', "\\n"));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: Labels<'_>, value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
    }

    /// A gauge with one sample.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, "gauge", help);
        self.sample(name, &[], value);
    }

    /// A counter with one sample.
    pub fn counter(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, "counter", help);
        self.sample(name, &[], value);
    }

    /// A gauge with one sample per label set.
    pub fn gauges<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels<'a>, f64)>,
    ) {
        self.header(name, "gauge", help);
        for (labels, value) in samples {
            self.sample(name, labels, value);
        }
    }

    /// A counter with one sample per label set.
    pub fn counters<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels<'a>, f64)>,
    ) {
        self.header(name, "counter", help);
        for (labels, value) in samples {
            self.sample(name, labels, value);
        }
    }

    /// A histogram from cumulative bucket counts (`cumulative[i]` = observations at or below
    /// `bounds[i]`), the total count and the sum of the observations.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        bounds: &[f64],
        cumulative: &[u64],
        count: u64,
        sum: f64,
    ) {
        self.header(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        for (bound, n) in bounds.iter().zip(cumulative) {
            self.sample(&bucket, &[("le", &number(*bound))], *n as f64);
        }
        self.sample(&bucket, &[("le", "+Inf")], count as f64);
        self.sample(&format!("{name}_sum"), &[], sum);
        self.sample(&format!("{name}_count"), &[], count as f64);
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// A sample value: integers without a fraction, others as Rust prints them (both parse).
fn number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_and_type_and_histograms_end_with_inf_sum_count() {
        let mut e = Exposition::new();
        e.gauge("x_rows", "Rows.", 3.0);
        e.counters(
            "x_requests_total",
            "Requests.",
            [(&[("route", "/a\"b"), ("status", "200")][..], 2.0)],
        );
        e.histogram("x_seconds", "Latency.", &[0.5, 1.0], &[1, 2], 3, 2.25);
        assert_eq!(
            e.finish(),
            "# HELP x_rows Rows.\n# TYPE x_rows gauge\nx_rows 3\n\
             # HELP x_requests_total Requests.\n# TYPE x_requests_total counter\n\
             x_requests_total{route=\"/a\\\"b\",status=\"200\"} 2\n\
             # HELP x_seconds Latency.\n# TYPE x_seconds histogram\n\
             x_seconds_bucket{le=\"0.5\"} 1\nx_seconds_bucket{le=\"1\"} 2\n\
             x_seconds_bucket{le=\"+Inf\"} 3\nx_seconds_sum 2.25\nx_seconds_count 3\n"
        );
    }
}
