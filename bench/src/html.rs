//! `--html`: a run as one self-contained page of charts, and the page pieces `compare --html`
//! shares.
//!
//! The page holds everything it shows: the charts are SVG drawn by `plotters` and written into
//! the page, the style sheet is inline, and there is no script, font, image or link to load, so
//! it opens the same from a CI artifact, a mail attachment or a machine without network. It is
//! also well-formed XML (every element closed, every text escaped), which lets a test parse it
//! whole.
//!
//! Per level, four figures, each a `<figure>` marked with `data-figure` and
//! `data-concurrency`: `throughput` (requests and errors per second over time), `latency` (p50,
//! p99 and max per second over time, log scale), `percentiles` (the latency at each percentile,
//! both axes log scale, the way HdrHistogram plots it) and `group-commits` (the server log's
//! records per group commit and mean commit time over time; only when the admin API answered).

use std::fmt::Write;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{LevelView, Report};

/// A chart's size in pixels.
const SIZE: (u32, u32) = (520, 330);
const FONT: &str = "sans-serif";
/// The fine grid lines: there, but quieter than the data.
pub(crate) const GRID: RGBAColor = RGBAColor(0, 0, 0, 0.04);
/// Key points to ask of a log axis from `low` to `high`: ten a decade make plotters give 1 to
/// 9 of each, of which [`log_label`] names 1, 2 and 5 (all nine would overlap).
fn log_labels(low: f64, high: f64) -> usize {
    ((high / low).log10().round() as usize).max(1) * 10 + 1
}

/// The series colours, told apart also in grey.
pub(crate) const BLUE_: RGBColor = RGBColor(31, 119, 180);
pub(crate) const RED_: RGBColor = RGBColor(214, 39, 40);
pub(crate) const GREEN_: RGBColor = RGBColor(44, 160, 44);
pub(crate) const ORANGE_: RGBColor = RGBColor(255, 127, 14);
pub(crate) const PURPLE_: RGBColor = RGBColor(148, 103, 189);
pub(crate) const BROWN_: RGBColor = RGBColor(140, 86, 75);

type Drawn = Result<(), Box<dyn std::error::Error>>;

/// Text for an HTML text node or attribute value.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page's head, style and title.
pub(crate) fn open_page(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n\
         <meta name=\"viewport\" content=\"width=device-width\"/>\n<title>{t}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<h1>{t}</h1>\n",
        t = escape(title)
    )
}

pub(crate) const CLOSE_PAGE: &str = "</body>\n</html>\n";

const STYLE: &str = "
body { font-family: sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
.charts { display: flex; flex-wrap: wrap; gap: 0.5em; }
figure.chart { margin: 0; border: 1px solid #ddd; }
p.note { color: #555; font-size: 0.9em; max-width: 60em; }
td.worse { background: #f8d7d7; } td.better { background: #d7f0d7; }
";

/// Draw into an SVG string with plotters.
pub(crate) fn svg(draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Drawn) -> String {
    let mut out = String::new();
    let drawn = {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        root.fill(&WHITE)
            .map_err(Into::into)
            .and_then(|()| draw(&root))
            .and_then(|()| root.present().map_err(Into::into))
    };
    if let Err(e) = drawn {
        // A chart that cannot be drawn says so in its place; the page and its figures hold.
        out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\
             <text x=\"10\" y=\"20\">chart not drawn: {}</text></svg>\n",
            SIZE.0,
            SIZE.1,
            escape(&e.to_string())
        );
    }
    out
}

/// A legend entry's line.
pub(crate) fn key(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
}

/// Lines through points, broken where a point is missing or a new run starts.
fn segments(points: impl Iterator<Item = (u32, f64, Option<f64>)>) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut last_run = None;
    let mut open = false;
    for (run, x, y) in points {
        match y {
            Some(y) if open && last_run == Some(run) => out.last_mut().expect("open").push((x, y)),
            Some(y) => {
                out.push(vec![(x, y)]);
                open = true;
            }
            None => open = false,
        }
        last_run = Some(run);
    }
    out
}

/// Draw `lines` as one labelled series.
fn series<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'a, DB, CT>,
    lines: Vec<Vec<(f64, f64)>>,
    color: RGBColor,
    label: &str,
) -> Drawn
where
    DB::ErrorType: 'static,
{
    let style = color.stroke_width(2);
    let mut first = true;
    for line in lines {
        let drawn = chart
            .draw_series(LineSeries::new(line, style).point_size(1))
            .map_err(|e| e.to_string())?;
        if std::mem::take(&mut first) {
            drawn.label(label).legend(key(color));
        }
    }
    if first {
        // Nothing to draw: the series still gets its legend entry, so the key is the same
        // on every chart of its kind.
        chart
            .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(key(color));
    }
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> Drawn
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 12))
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The time axis: the level's measured seconds.
fn time_span(l: &LevelView) -> f64 {
    let last = l.timeline.iter().map(|s| s.second + 1.0).fold(0.0, f64::max);
    let server = l.server_timeline.iter().flatten().map(|s| s.second).fold(0.0, f64::max);
    last.max(server).max(l.elapsed_seconds).max(1.0)
}

/// Requests and errors per second over time.
pub fn throughput_chart(l: &LevelView) -> String {
    let span = time_span(l);
    let top = l
        .timeline
        .iter()
        .map(|s| s.requests_per_second.max(s.errors_per_second))
        .fold(1.0, f64::max)
        * 1.15;
    let at = |s: &crate::report::SecondView| (s.repeat, s.second + 0.5);
    svg(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!("Requests and errors per second, concurrency {}", l.concurrency),
                (FONT, 16),
            )
            .margin(10)
            .x_label_area_size(38)
            .y_label_area_size(62)
            .build_cartesian_2d(0f64..span, 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("seconds into the measurement")
            .y_desc("per second")
            .label_style((FONT, 12))
            .light_line_style(GRID)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        let req = l.timeline.iter().map(|s| (at(s).0, at(s).1, Some(s.requests_per_second)));
        series(&mut chart, segments(req), BLUE_, "requests/s")?;
        let err = l.timeline.iter().map(|s| (at(s).0, at(s).1, Some(s.errors_per_second)));
        series(&mut chart, segments(err), RED_, "errors/s")?;
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

/// Latency p50, p99 and max per second over time, log scale.
pub fn latency_chart(l: &LevelView) -> String {
    let span = time_span(l);
    let values = l.timeline.iter().flat_map(|s| [s.p50, s.p99, s.max]).flatten();
    let (low, high) = values.fold((f64::MAX, 0f64), |(a, b), v| (a.min(v), b.max(v)));
    let (low, high) = decades(low, high);
    svg(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(format!("Latency per second, concurrency {}", l.concurrency), (FONT, 16))
            .margin(10)
            .x_label_area_size(38)
            .y_label_area_size(62)
            .build_cartesian_2d(0f64..span, (low..high).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("seconds into the measurement")
            .y_desc("latency, ms (log)")
            .label_style((FONT, 12))
            // A log axis's fine lines crowd below each power of ten into a grey band.
            .light_line_style(TRANSPARENT)
            .y_labels(log_labels(low, high))
            .y_label_formatter(&|v| log_label(*v))
            .draw()?;
        let line = |f: fn(&crate::report::SecondView) -> Option<f64>| {
            segments(l.timeline.iter().map(move |s| (s.repeat, s.second + 0.5, f(s))))
        };
        series(&mut chart, line(|s| s.p50), GREEN_, "p50")?;
        series(&mut chart, line(|s| s.p99), ORANGE_, "p99")?;
        series(&mut chart, line(|s| s.max), RED_, "max")?;
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

/// A latency or count, short.
pub(crate) fn short(v: f64) -> String {
    if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        let digits = (-v.log10()).ceil() as usize + 1;
        format!("{v:.digits$}")
    }
}

/// A log axis from `low` to `high` widened to whole decades, with room above the highest
/// value for the legend: plotters marks a log axis from its first power of ten on, so an axis
/// from 1.3 to 40 would show only 10.
fn decades(low: f64, high: f64) -> (f64, f64) {
    if !(high > 0.0 && low > 0.0 && low <= high) {
        return (0.01, 1.0);
    }
    let floor = 10f64.powf(low.log10().floor());
    (floor, 10f64.powf((high * 2.5).log10().ceil()).max(floor * 10.0))
}

/// A log axis's label: 1, 2 and 5 of each decade, the rest left blank.
fn log_label(v: f64) -> String {
    let mantissa = v / 10f64.powf(v.log10().floor());
    if [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 0.01) {
        short(v)
    } else {
        String::new()
    }
}

/// The percentile a point of the HDR x axis (1 / (1 - q)) stands for.
fn percentile_label(x: f64) -> String {
    let tail = 1.0 / x.max(1.0);
    let p = 100.0 * (1.0 - tail);
    let decimals = ((-tail.log10()).round() as i32 - 2).max(0) as usize;
    format!("{p:.decimals$}%")
}

/// The latency at each percentile: x is 1 / (1 - q) on a log scale, so 90 %, 99 %, 99.9 %
/// are evenly spaced and the tail gets the room; y is the latency, log scale.
pub fn percentile_chart(l: &LevelView) -> String {
    let n = l.requests.max(2) as f64;
    let pts: Vec<(f64, f64)> = l
        .latency_curve
        .iter()
        .map(|p| (1.0 / (1.0 - (p.percentile / 100.0).min(1.0 - 1.0 / n)), p.ms.max(0.001)))
        .collect();
    let right = pts.iter().map(|p| p.0).fold(10.0, f64::max) * 1.2;
    let (low, high) = pts.iter().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (low, high) = decades(low, high);
    svg(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(format!("Latency by percentile, concurrency {}", l.concurrency), (FONT, 16))
            .margin(10)
            .x_label_area_size(38)
            .y_label_area_size(62)
            .build_cartesian_2d((1f64..right).log_scale(), (low..high).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("percentile (log scale of 1 / (1 - percentile))")
            .y_desc("latency, ms (log)")
            .label_style((FONT, 12))
            // A log axis's fine lines crowd below each power of ten into a grey band.
            .light_line_style(TRANSPARENT)
            .y_labels(log_labels(low, high))
            .x_label_formatter(&|v| percentile_label(*v))
            .y_label_formatter(&|v| log_label(*v))
            .draw()?;
        let label = format!("{} requests", l.requests);
        series(&mut chart, vec![pts], PURPLE_, &label)?;
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    })
}

/// The server log's group commits over time: records per commit (left axis) and the mean
/// commit time (right axis).
pub fn group_commit_chart(l: &LevelView) -> Option<String> {
    let t = l.server_timeline.as_ref()?;
    let span = time_span(l);
    // Headroom above the lines for the legend.
    let per = t.iter().map(|s| s.records_per_flush).fold(1.0, f64::max) * 1.5;
    let ms = t.iter().map(|s| s.flush_mean_ms).fold(0.1, f64::max) * 1.5;
    Some(svg(|root| {
        let mut chart = ChartBuilder::on(root)
            .caption(format!("Server group commits, concurrency {}", l.concurrency), (FONT, 16))
            .margin(10)
            .x_label_area_size(38)
            .y_label_area_size(62)
            .right_y_label_area_size(62)
            .build_cartesian_2d(0f64..span, 0f64..per)?
            .set_secondary_coord(0f64..span, 0f64..ms);
        chart
            .configure_mesh()
            .x_desc("seconds into the measurement")
            .y_desc("records per group commit")
            .label_style((FONT, 12))
            .light_line_style(GRID)
            .y_label_formatter(&|v| short(*v))
            .draw()?;
        chart
            .configure_secondary_axes()
            .y_desc("mean commit time, ms")
            .label_style((FONT, 12))
            .y_label_formatter(&|v| short(*v))
            .draw()?;
        // Intervals without a commit have no records per commit to show.
        let per_flush = t
            .iter()
            .map(|s| (0, s.second, (s.flushes_per_second > 0.0).then_some(s.records_per_flush)));
        series(&mut chart, segments(per_flush), BLUE_, "records per commit (left)")?;
        let style = BROWN_.stroke_width(2);
        let mut labelled = false;
        for line in segments(
            t.iter()
                .map(|s| (0, s.second, (s.flushes_per_second > 0.0).then_some(s.flush_mean_ms))),
        ) {
            let drawn = chart
                .draw_secondary_series(LineSeries::new(line, style).point_size(1))
                .map_err(|e| e.to_string())?;
            if !std::mem::replace(&mut labelled, true) {
                drawn.label("mean commit ms (right)").legend(key(BROWN_));
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }))
}

/// A table row of `cells`, the first one text.
fn row(out: &mut String, cells: &[String]) {
    out.push_str("<tr>");
    for (i, c) in cells.iter().enumerate() {
        let class = if i == 0 { " class=\"text\"" } else { "" };
        let _ = write!(out, "<td{class}>{}</td>", escape(c));
    }
    out.push_str("</tr>\n");
}

fn header(out: &mut String, cells: &[&str]) {
    out.push_str("<tr>");
    for (i, c) in cells.iter().enumerate() {
        let class = if i == 0 { " class=\"text\"" } else { "" };
        let _ = write!(out, "<th{class}>{}</th>", escape(c));
    }
    out.push_str("</tr>\n");
}

/// A two-column table of names and values.
fn facts(out: &mut String, title: &str, items: &[(&str, String)]) {
    let _ = write!(out, "<h2>{}</h2>\n<table>\n", escape(title));
    for (k, v) in items {
        let _ = writeln!(
            out,
            "<tr><th class=\"text\">{}</th><td class=\"text\">{}</td></tr>",
            escape(k),
            escape(v)
        );
    }
    out.push_str("</table>\n");
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The whole page of a run.
pub fn page(r: &Report) -> String {
    let mut out = open_page(&format!("sheetd bench: {}", r.workload.name));
    let mix: Vec<String> =
        r.workload.mix.iter().map(|m| format!("{}={}", m.op, m.weight)).collect();
    let target = match r.target.mode {
        "own" => "own server, in-process, generated data".to_owned(),
        _ => r.target.url.clone(),
    };
    let loaded = r.target.loaded.as_ref().map(|l| format!("{} rows in {:.1} s", l.rows, l.seconds));
    facts(
        &mut out,
        "Settings",
        &[
            ("workload", format!("{} ({})", r.workload.name, mix.join(", "))),
            ("target", target),
            ("sheets", r.target.sheets.len().to_string()),
            ("rows per sheet", opt(r.target.rows_per_sheet)),
            ("columns", opt(r.target.columns)),
            ("loaded", opt(loaded)),
            ("loop", r.load.kind.to_owned()),
            ("rate, requests/s", opt(r.load.rate)),
            (
                "measured per level",
                match (r.load.duration_seconds, r.load.requests) {
                    (_, Some(n)) => format!("{n} requests"),
                    (Some(d), None) => format!("{d} s"),
                    _ => "-".to_owned(),
                },
            ),
            ("warm-up", format!("{} s", r.load.warmup_seconds)),
            ("runs per level", r.load.repeat.to_string()),
            ("client threads", r.load.client_threads.to_string()),
            (
                "page size / bulk size",
                format!("{} / {}", r.workload.page_size, r.workload.bulk_size),
            ),
            ("conflict rate", r.workload.conflict_rate.to_string()),
            ("passed", r.passed.to_string()),
        ],
    );
    let m = &r.machine;
    facts(
        &mut out,
        "Machine and build",
        &[
            ("system", format!("{} {}", m.os, m.arch)),
            ("cores", m.cores.to_string()),
            ("cpu", opt(m.cpu.clone())),
            (
                "memory",
                opt(m.memory_bytes.map(|b| format!("{:.1} GiB", b as f64 / f64::from(1 << 30)))),
            ),
            ("load average (1 min) at the end", opt(m.load_average)),
            ("build", format!("sheetd {} ({})", r.build.version, r.build.profile)),
        ],
    );
    for w in &r.warnings {
        let _ = writeln!(out, "<p class=\"note\">Warning: {}</p>", escape(w));
    }
    out.push_str("<h2>Levels</h2>\n<table>\n");
    header(
        &mut out,
        &[
            "concurrency",
            "req/s",
            "spread",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "p99.9 ms",
            "max ms",
            "errors",
            "rec/commit",
            "commit ms",
        ],
    );
    for l in &r.levels {
        let ms = &l.latency_ms;
        let (per, cms) = match &l.server {
            Some(f) if f.flushes > 0 => {
                (format!("{:.1}", f.records_per_flush), format!("{:.2}", f.flush_mean_ms))
            }
            _ => ("-".to_owned(), "-".to_owned()),
        };
        row(
            &mut out,
            &[
                l.concurrency.to_string(),
                format!("{:.0}", l.requests_per_second),
                l.spread
                    .as_ref()
                    .map_or("-".to_owned(), |s| format!("{:.1} %", s.requests_per_second * 100.0)),
                format!("{:.2}", ms.p50),
                format!("{:.2}", ms.p90),
                format!("{:.2}", ms.p99),
                format!("{:.2}", ms.p999),
                format!("{:.2}", ms.max),
                l.error_requests.to_string(),
                per,
                cms,
            ],
        );
    }
    out.push_str("</table>\n");
    for l in &r.levels {
        let c = l.concurrency;
        let _ = writeln!(out, "<h2>Concurrency {c}</h2>\n<div class=\"charts\">");
        let mut figure = |name: &str, chart: String| {
            let _ = writeln!(
                out,
                "<figure class=\"chart\" data-figure=\"{name}\" data-concurrency=\"{c}\">\n{chart}</figure>"
            );
        };
        figure("throughput", throughput_chart(l));
        figure("latency", latency_chart(l));
        figure("percentiles", percentile_chart(l));
        let commits = group_commit_chart(l);
        let missing = commits.is_none();
        if let Some(chart) = commits {
            figure("group-commits", chart);
        }
        out.push_str("</div>\n");
        if missing {
            out.push_str(
                "<p class=\"note\">No group-commit figures: the server's admin API did not \
                 answer (a running server needs --admin-url and --admin-token).</p>\n",
            );
        }
    }
    out.push_str(CLOSE_PAGE);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_labels_read_as_percentiles() {
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(percentile_label(2.0), "50%");
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(100.0), "99%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        assert_eq!(percentile_label(10_000.0), "99.99%");
    }

    #[test]
    fn lines_break_at_gaps_and_between_runs() {
        let pts = [
            (0, 0.5, Some(1.0)),
            (0, 1.5, None),
            (0, 2.5, Some(2.0)),
            (0, 3.5, Some(3.0)),
            (1, 4.5, Some(4.0)),
        ];
        let s = segments(pts.into_iter());
        assert_eq!(s, vec![vec![(0.5, 1.0)], vec![(2.5, 2.0), (3.5, 3.0)], vec![(4.5, 4.0)]]);
    }

    #[test]
    fn log_axes_name_one_two_and_five() {
        let named: Vec<String> = [0.1, 0.2, 0.3, 1.0, 5.0, 7.0, 20.0].map(log_label).to_vec();
        assert_eq!(named, ["0.10", "0.20", "", "1.0", "5.0", "", "20"]);
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
