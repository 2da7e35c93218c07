//! `sheetd bench compare A.json B.json`: is B faster or slower than A, beyond the noise the
//! two runs themselves show?
//!
//! # How a change is decided
//!
//! Per workload and concurrency level, each file gives samples of each figure (requests per
//! second, and the p50, p90, p99, p99.9 and max latency): one per run of the level, that is
//! each `--repeat` run of each level entry with that concurrency (a level listed twice in
//! `--concurrency` counts twice). A file without `repeats` (written before them) gives its
//! level's figures as one sample.
//!
//! - The ratio is B's median over A's median.
//! - A file's spread of a figure is (largest - smallest) / median of its samples, 0 for one
//!   sample; the noise band is the larger of the two files' spreads.
//! - A ratio is a change when it is further from 1 than the band. With one run per level on
//!   both sides the band is 0 and every difference counts: the output says so, since only
//!   repeated runs (`--repeat 3`) can tell noise from a change.
//! - `--fail-if PCT`: exit status 1 when a change is worse by more than PCT %: throughput below
//!   1 - PCT/100 of A's, or a percentile above 1 + PCT/100 of A's.
//!
//! Unreadable files exit with status 2.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::process::ExitCode;

use anyhow::Context;
use plotters::prelude::*;
use serde_json::Value;

use crate::args::CompareArgs;
use crate::html;
use crate::report::{median_sorted, relative_spread};

/// The figures compared, with the JSON names of a run's `latencyMs`.
const METRICS: [(&str, &str); 6] = [
    ("req/s", "requestsPerSecond"),
    ("p50", "p50"),
    ("p90", "p90"),
    ("p99", "p99"),
    ("p99.9", "p999"),
    ("max", "max"),
];

/// One figure of one workload and level in both files.
#[derive(Clone, Debug)]
pub struct Line {
    /// The workload's name.
    pub workload: String,
    /// Concurrency.
    pub concurrency: u64,
    /// `req/s`, `p50` ... `max`.
    pub metric: &'static str,
    /// A's samples, sorted.
    pub a: Vec<f64>,
    /// B's samples, sorted.
    pub b: Vec<f64>,
    /// B's median over A's.
    pub ratio: f64,
    /// The larger of the two spreads.
    pub band: f64,
    /// Beyond the band.
    pub change: bool,
    /// A change for the worse: less throughput, or more latency.
    pub worse: bool,
}

impl Line {
    fn higher_is_better(&self) -> bool {
        self.metric == "req/s"
    }

    /// A change for the worse by more than `pct` percent.
    pub fn fails(&self, pct: f64) -> bool {
        let limit = pct / 100.0;
        self.change
            && self.worse
            && if self.higher_is_better() {
                self.ratio < 1.0 - limit
            } else {
                self.ratio > 1.0 + limit
            }
    }

    fn verdict(&self) -> &'static str {
        match (self.change, self.worse) {
            (false, _) => "no change",
            (true, true) => "worse",
            (true, false) => "better",
        }
    }
}

/// Two runs compared.
#[derive(Clone, Debug, Default)]
pub struct Comparison {
    /// Per workload, level and figure, in the order of A's levels.
    pub lines: Vec<Line>,
    /// Levels only one file has (`workload c=N only in A`).
    pub unmatched: Vec<String>,
    /// Whether every level on both sides has a single run (so no spread is known).
    pub no_spread: bool,
}

/// Per (workload, concurrency), each metric's samples, in first-seen order.
type Samples = Vec<((String, u64), [Vec<f64>; 6])>;

fn samples(run: &Value) -> anyhow::Result<Samples> {
    let workload = run["workload"]["name"].as_str().context("no workload.name")?.to_owned();
    let levels = run["levels"].as_array().context("no levels")?;
    let mut out: Samples = Vec::new();
    for l in levels {
        let c = l["concurrency"].as_u64().context("a level without concurrency")?;
        let runs: Vec<&Value> = match l["repeats"].as_array() {
            Some(r) if !r.is_empty() => r.iter().collect(),
            _ => vec![l],
        };
        let key = (workload.clone(), c);
        let i = match out.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                out.push((key, Default::default()));
                out.len() - 1
            }
        };
        for r in runs {
            for (m, (_, name)) in METRICS.iter().enumerate() {
                let v = if m == 0 { &r[*name] } else { &r["latencyMs"][*name] };
                let v = v.as_f64().with_context(|| format!("c={c}: no {name}"))?;
                out[i].1[m].push(v);
            }
        }
    }
    Ok(out)
}

/// Compare two runs' JSON documents.
///
/// # Errors
///
/// A document is not a `sheetd bench --json` one.
pub fn compare(a: &Value, b: &Value) -> anyhow::Result<Comparison> {
    let (sa, sb) = (samples(a).context("A")?, samples(b).context("B")?);
    let mut cmp = Comparison { no_spread: true, ..Comparison::default() };
    for ((key, ma), (_, mb)) in
        sa.iter().filter_map(|x| sb.iter().find(|y| y.0 == x.0).map(|y| (x, y)))
    {
        for (m, (metric, _)) in METRICS.iter().enumerate() {
            let (mut xa, mut xb) = (ma[m].clone(), mb[m].clone());
            xa.sort_by(f64::total_cmp);
            xb.sort_by(f64::total_cmp);
            if xa.len() > 1 || xb.len() > 1 {
                cmp.no_spread = false;
            }
            let (med_a, med_b) = (median_sorted(&xa), median_sorted(&xb));
            let ratio = if med_a > 0.0 {
                med_b / med_a
            } else if med_b > 0.0 {
                f64::INFINITY
            } else {
                1.0
            };
            let band = relative_spread(&xa).max(relative_spread(&xb));
            let change = (ratio - 1.0).abs() > band;
            let worse = if m == 0 { ratio < 1.0 } else { ratio > 1.0 };
            cmp.lines.push(Line {
                workload: key.0.clone(),
                concurrency: key.1,
                metric,
                a: xa,
                b: xb,
                ratio,
                band,
                change,
                worse,
            });
        }
    }
    for (side, mine, theirs) in [("A", &sa, &sb), ("B", &sb, &sa)] {
        for (k, _) in mine.iter().filter(|x| !theirs.iter().any(|y| y.0 == x.0)) {
            cmp.unmatched.push(format!("{} c={} only in {side}", k.0, k.1));
        }
    }
    Ok(cmp)
}

fn range(v: &[f64]) -> String {
    let med = median_sorted(v);
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) if v.len() > 1 => {
            format!("{} ({}-{})", html::short(med), html::short(*lo), html::short(*hi))
        }
        _ => html::short(med),
    }
}

impl Comparison {
    /// Lines that fail `--fail-if pct`.
    pub fn failures(&self, pct: f64) -> impl Iterator<Item = &Line> {
        self.lines.iter().filter(move |l| l.fails(pct))
    }

    /// The table for a person.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<12} {:>5} {:<6} {:>24} {:>24} {:>7} {:>7}  verdict",
            "workload", "conc", "figure", "A median (range)", "B median (range)", "B/A", "spread"
        );
        for l in &self.lines {
            let _ = writeln!(
                out,
                "{:<12} {:>5} {:<6} {:>24} {:>24} {:>7.3} {:>6.1}%  {}",
                l.workload,
                l.concurrency,
                l.metric,
                range(&l.a),
                range(&l.b),
                l.ratio,
                l.band * 100.0,
                l.verdict()
            );
        }
        for u in &self.unmatched {
            let _ = writeln!(out, "{u}");
        }
        if self.no_spread {
            out.push_str(
                "note: each level ran once in both files, so their spread is unknown and every \
                 difference counts as a change; runs with --repeat 3 tell noise from change\n",
            );
        }
        out
    }

    /// The comparison as one self-contained HTML page: the table, and per workload a chart of
    /// the ratios by level.
    pub fn page(&self, a: &str, b: &str) -> String {
        let mut out = html::open_page("sheetd bench compare");
        let _ = writeln!(
            out,
            "<p>A: <code>{}</code><br/>B: <code>{}</code></p>\n<p class=\"note\">B/A is B's \
             median over A's; spread is the larger of the two files' (largest - smallest) / \
             median over the runs of the level. A ratio further from 1 than the spread is a \
             change.</p>",
            html::escape(a),
            html::escape(b)
        );
        if self.no_spread {
            out.push_str(
                "<p class=\"note\">Each level ran once in both files: the spread is unknown and \
                 every difference counts as a change (run with --repeat 3).</p>\n",
            );
        }
        out.push_str(
            "<table>\n<tr><th class=\"text\">workload</th><th>concurrency</th>\
                       <th class=\"text\">figure</th><th>A</th><th>B</th><th>B/A</th>\
                       <th>spread</th><th class=\"text\">verdict</th></tr>\n",
        );
        for l in &self.lines {
            let class = match (l.change, l.worse) {
                (false, _) => "",
                (true, true) => " class=\"worse\"",
                (true, false) => " class=\"better\"",
            };
            let _ = writeln!(
                out,
                "<tr><td class=\"text\">{}</td><td>{}</td><td class=\"text\">{}</td><td>{}</td>\
                 <td>{}</td><td{class}>{:.3}</td><td>{:.1} %</td><td class=\"text\">{}</td></tr>",
                html::escape(&l.workload),
                l.concurrency,
                l.metric,
                range(&l.a),
                range(&l.b),
                l.ratio,
                l.band * 100.0,
                l.verdict()
            );
        }
        out.push_str("</table>\n");
        for u in &self.unmatched {
            let _ = writeln!(out, "<p class=\"note\">{}</p>", html::escape(u));
        }
        let mut workloads: BTreeMap<&str, Vec<&Line>> = BTreeMap::new();
        for l in &self.lines {
            workloads.entry(&l.workload).or_default().push(l);
        }
        out.push_str("<div class=\"charts\">\n");
        for (w, lines) in workloads {
            let _ = writeln!(
                out,
                "<figure class=\"chart\" data-figure=\"ratios\" data-workload=\"{}\">\n{}</figure>",
                html::escape(w),
                ratio_chart(w, &lines)
            );
        }
        out.push_str("</div>\n");
        out.push_str(html::CLOSE_PAGE);
        out
    }
}

/// B/A of each figure by level (levels evenly spaced, labelled with their concurrency).
fn ratio_chart(workload: &str, lines: &[&Line]) -> String {
    let mut levels: Vec<u64> = lines.iter().map(|l| l.concurrency).collect();
    levels.sort_unstable();
    levels.dedup();
    let finite = lines.iter().map(|l| l.ratio).filter(|r| r.is_finite());
    let (lo, hi) = finite.fold((1f64, 1f64), |(a, b), r| (a.min(r), b.max(r)));
    let (lo, hi) = ((lo * 0.9).min(0.9), (hi * 1.1).max(1.1));
    let n = levels.len() as f64;
    let colors =
        [html::BLUE_, html::GREEN_, html::ORANGE_, html::RED_, html::PURPLE_, html::BROWN_];
    let labels = levels.clone();
    html::svg(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(format!("B/A by level, {workload}"), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(38)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.5f64..n - 0.5, lo..hi)?;
        chart
            .configure_mesh()
            .x_desc("concurrency")
            .y_desc("B / A")
            .x_labels(levels.len().max(2))
            .x_label_formatter(&|x| {
                let i = x.round();
                match labels.get(i as usize) {
                    Some(c) if (x - i).abs() < 1e-6 && i >= 0.0 => c.to_string(),
                    _ => String::new(),
                }
            })
            .y_label_formatter(&|v| format!("{v:.2}"))
            .label_style(("sans-serif", 12))
            .light_line_style(html::GRID)
            .draw()?;
        chart.draw_series(LineSeries::new([(-0.5, 1.0), (n - 0.5, 1.0)], BLACK.mix(0.5)))?;
        for ((metric, _), color) in METRICS.iter().zip(colors) {
            let pts: Vec<(f64, f64)> = lines
                .iter()
                .filter(|l| l.metric == *metric && l.ratio.is_finite())
                .filter_map(|l| {
                    levels.iter().position(|c| *c == l.concurrency).map(|i| (i as f64, l.ratio))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)).point_size(3))?
                .label(*metric)
                .legend(html::key(color));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 12))
            .draw()?;
        Ok(())
    })
}

/// `sheetd bench compare`: print the table, write the page, and exit 1 when `--fail-if` finds
/// a change beyond it (2 when a file cannot be read).
pub fn main(args: &CompareArgs) -> ExitCode {
    let read = |p: &std::path::Path| -> anyhow::Result<Value> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", p.display()))
    };
    let cmp = match read(&args.a)
        .and_then(|a| Ok((a, read(&args.b)?)))
        .and_then(|(a, b)| compare(&a, &b))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sheetd bench compare: {e:#}");
            return ExitCode::from(2);
        }
    };
    print!("{}", cmp.table());
    if let Some(path) = &args.html {
        let page = cmp.page(&args.a.display().to_string(), &args.b.display().to_string());
        if let Err(e) = std::fs::write(path, page) {
            eprintln!("sheetd bench compare: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    let Some(pct) = args.fail_if else { return ExitCode::SUCCESS };
    let failures: Vec<&Line> = cmp.failures(pct).collect();
    if failures.is_empty() {
        return ExitCode::SUCCESS;
    }
    for l in failures {
        eprintln!(
            "sheetd bench compare: {} c={} {}: B/A {:.3}, worse by more than {pct} % and beyond \
             the spread ({:.1} %)",
            l.workload,
            l.concurrency,
            l.metric,
            l.ratio,
            l.band * 100.0
        );
    }
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(rps: &[f64], p99: &[f64]) -> Value {
        let repeats: Vec<Value> = rps
            .iter()
            .zip(p99)
            .map(|(r, p)| {
                json!({"requestsPerSecond": r, "latencyMs": {"p50": 1.0, "p90": 2.0, "p99": p,
                       "p999": 5.0, "max": 9.0}})
            })
            .collect();
        json!({"workload": {"name": "patch"}, "levels": [{"concurrency": 4, "repeats": repeats}]})
    }

    fn line<'a>(c: &'a Comparison, metric: &str) -> &'a Line {
        c.lines.iter().find(|l| l.metric == metric).unwrap()
    }

    #[test]
    fn a_difference_within_the_runs_spread_is_no_change() {
        let c = compare(&run(&[100.0, 120.0], &[3.0, 3.0]), &run(&[110.0, 125.0], &[3.0, 3.0]))
            .unwrap();
        let l = line(&c, "req/s");
        assert!(!l.change && !l.fails(0.0), "{l:?}");
        assert!(!c.no_spread);
    }

    #[test]
    fn a_drop_beyond_the_spread_fails_above_its_percentage() {
        let c =
            compare(&run(&[100.0, 104.0], &[3.0, 3.1]), &run(&[50.0, 52.0], &[6.0, 6.2])).unwrap();
        let l = line(&c, "req/s");
        assert!(l.change && l.worse && (l.ratio - 0.5).abs() < 1e-9, "{l:?}");
        assert!(l.fails(10.0) && !l.fails(60.0));
        let p = line(&c, "p99");
        assert!(p.change && p.worse && p.fails(10.0), "{p:?}");
        assert!(!line(&c, "p50").change);
    }

    #[test]
    fn single_runs_have_no_spread_and_unmatched_levels_are_named() {
        let a = json!({"workload": {"name": "patch"}, "levels": [
            {"concurrency": 1, "requestsPerSecond": 10.0,
             "latencyMs": {"p50": 1.0, "p90": 1.0, "p99": 1.0, "p999": 1.0, "max": 1.0}}]});
        let mut b = a.clone();
        b["levels"][0]["concurrency"] = json!(2);
        let c = compare(&a, &b).unwrap();
        assert!(c.lines.is_empty() && c.no_spread);
        assert_eq!(c.unmatched, ["patch c=1 only in A", "patch c=2 only in B"]);
        assert_eq!(compare(&a, &a).unwrap().failures(0.0).count(), 0);
    }
}
