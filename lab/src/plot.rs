//! PNG line charts for the benchmarks: panels stacked over a shared x axis, drawn with
//! plotters; text is rendered by ab_glyph from DejaVu Sans (Debian's fonts-dejavu-core).

use std::{path::Path, sync::OnceLock};

use anyhow::{Result, anyhow, bail};
use plotters::{
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const FONT: &str = "sans-serif";
const WIDTH: u32 = 1000;
const PANEL_HEIGHT: u32 = 360;
const TITLE_HEIGHT: u32 = 40;

/// Series colours, in the order series names first appear in a chart.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];
const REFERENCE: RGBColor = RGBColor(110, 110, 110);

/// One line: `(x, y)` points in x order.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart panel.
#[derive(Clone, Debug)]
pub struct Panel {
    pub y_label: String,
    pub series: Vec<Series>,
    /// Top of the y axis; `None`: from the data and reference lines (the axis starts at 0
    /// unless the data goes below).
    pub y_max: Option<f64>,
    /// Labelled horizontal reference lines (e.g. capacity, target), dashed grey.
    pub hlines: Vec<(String, f64)>,
}

/// Register DejaVu Sans as plotters' "sans-serif" once per process.
fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT_PATH).map_err(|e| {
                format!(
                    "reading the chart font {FONT_PATH}: {e} (install the Debian package \
                     fonts-dejavu-core)"
                )
            })?;
            // plotters keeps a `&'static` font.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT, FontStyle::Normal, bytes)
                .map_err(|_| format!("{FONT_PATH} is not a usable TrueType font"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// The finite `(min, max)` of `values`, widened to a non-empty range.
fn range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    (lo <= hi).then_some((lo, if hi > lo { hi } else { lo + 1.0 }))
}

/// An axis tick: at most two decimals, trailing zeros dropped.
fn tick(v: &f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.into() }
}

/// One PNG with `panels` stacked vertically sharing the x axis (its label under the last
/// panel); a legend in each panel; the same series name has the same colour in every panel.
/// 1000 px wide, 360 px per panel.
pub fn chart(path: &Path, title: &str, x_label: &str, panels: &[Panel]) -> Result<()> {
    draw(path, title, x_label, panels, false)
}

/// [`chart`] with a logarithmic x axis (base 2; every x must be positive), for quantities
/// such as an overload factor from 1× to 20×.
pub fn chart_log_x(path: &Path, title: &str, x_label: &str, panels: &[Panel]) -> Result<()> {
    let positive = panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| &s.points)
        .all(|p| p.0 > 0.0);
    if !positive {
        bail!("chart {title:?}: a logarithmic x axis needs positive x");
    }
    let logged: Vec<Panel> = panels
        .iter()
        .map(|p| Panel {
            series: p
                .series
                .iter()
                .map(|s| Series {
                    name: s.name.clone(),
                    points: s.points.iter().map(|&(x, y)| (x.log2(), y)).collect(),
                })
                .collect(),
            ..p.clone()
        })
        .collect();
    draw(path, title, x_label, &logged, true)
}

/// A tick of a base-2 logarithmic axis: the value it stands for.
fn log_tick(v: &f64) -> String {
    tick(&2f64.powf(*v))
}

fn draw(path: &Path, title: &str, x_label: &str, panels: &[Panel], log_x: bool) -> Result<()> {
    if panels.is_empty() {
        bail!("chart {title:?}: no panels");
    }
    register_font()?;
    let mut names: Vec<&str> = Vec::new();
    for s in panels.iter().flat_map(|p| &p.series) {
        if !names.contains(&s.name.as_str()) {
            names.push(&s.name);
        }
    }
    let colour = |name: &str| {
        let i = names.iter().position(|n| *n == name).unwrap_or(0);
        PALETTE[i % PALETTE.len()]
    };
    let all_points = || {
        panels
            .iter()
            .flat_map(|p| &p.series)
            .flat_map(|s| &s.points)
    };
    let (x_min, x_max) = range(all_points().map(|p| p.0)).unwrap_or((0.0, 1.0));

    let height = TITLE_HEIGHT + PANEL_HEIGHT * panels.len() as u32;
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let body = root.titled(title, (FONT, 24))?;
    let areas = body.split_evenly((panels.len(), 1));
    for (i, (panel, area)) in panels.iter().zip(&areas).enumerate() {
        let last = i + 1 == panels.len();
        let ys = panel.series.iter().flat_map(|s| &s.points).map(|p| p.1);
        let (data_min, data_max) =
            range(ys.chain(panel.hlines.iter().map(|h| h.1))).unwrap_or((0.0, 1.0));
        let y_min = data_min.min(0.0);
        let y_max = panel.y_max.unwrap_or(data_max * 1.1).max(y_min + 1e-9);

        let mut chart = ChartBuilder::on(area)
            .margin(10)
            .margin_right(30)
            .x_label_area_size(if last { 50 } else { 30 })
            .y_label_area_size(80)
            .build_cartesian_2d(x_min..x_max, y_min..y_max)?;
        let mut mesh = chart.configure_mesh();
        mesh.y_desc(panel.y_label.as_str())
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 16))
            .x_label_formatter(if log_x { &log_tick } else { &tick })
            .y_label_formatter(&tick)
            .light_line_style(WHITE.mix(0.0));
        if last {
            mesh.x_desc(x_label);
        }
        mesh.draw()?;

        for (label, y) in &panel.hlines {
            chart.draw_series(DashedLineSeries::new(
                [(x_min, *y), (x_max, *y)],
                8,
                6,
                REFERENCE.stroke_width(2),
            ))?;
            let style = (FONT, 14)
                .into_font()
                .color(&REFERENCE)
                .pos(Pos::new(HPos::Left, VPos::Bottom));
            chart.draw_series(std::iter::once(Text::new(
                format!(" {label}"),
                (x_min, *y),
                style,
            )))?;
        }
        for s in &panel.series {
            let c = colour(&s.name);
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))?
                .label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], c.stroke_width(3)));
        }
        if !panel.series.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .label_font((FONT, 14))
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK.mix(0.4))
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// Removes the file when dropped, also on panic.
    struct Remove(PathBuf);

    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn series(name: &str, f: impl Fn(f64) -> f64) -> Series {
        let points = (0..=60)
            .map(|i| {
                let t = f64::from(i) * 0.5;
                (t, f(t))
            })
            .collect();
        Series {
            name: name.into(),
            points,
        }
    }

    #[test]
    fn two_panels_make_a_png() {
        let path =
            std::env::temp_dir().join(format!("shedder-plot-test-{}.png", std::process::id()));
        let file = Remove(path.clone());
        let panels = [
            Panel {
                y_label: "goodput (req/s)".into(),
                series: vec![
                    series("offered", |t| 100.0 + 20.0 * t),
                    series("shedder", |t| (100.0 + 20.0 * t).min(195.0)),
                    series("haproxy", |t| (100.0 + 20.0 * t).min(180.0 - t)),
                ],
                y_max: None,
                hlines: vec![("capacity".into(), 200.0)],
            },
            Panel {
                y_label: "p99 latency (ms)".into(),
                series: vec![
                    series("shedder", |t| 25.0 + (t * 0.7).sin() * 5.0),
                    series("haproxy", |t| 25.0 + 8.0 * t),
                ],
                y_max: Some(300.0),
                hlines: vec![("target 50 ms".into(), 50.0)],
            },
        ];
        chart(&path, "Test chart", "time (s)", &panels).expect("chart");

        let png = std::fs::read(&path).expect("read the chart");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
        assert!(png.len() > 10_000, "only {} bytes", png.len());
        let be = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
        assert_eq!((be(16), be(20)), (WIDTH, TITLE_HEIGHT + 2 * PANEL_HEIGHT));
        drop(file);
        assert!(!path.exists());

        assert!(chart(&path, "empty", "x", &[]).is_err());
    }

    #[test]
    fn a_log_axis_needs_positive_x_and_labels_the_values() {
        let path =
            std::env::temp_dir().join(format!("shedder-plot-log-{}.png", std::process::id()));
        let _file = Remove(path.clone());
        let panel = |points: Vec<(f64, f64)>| Panel {
            y_label: "goodput (%)".into(),
            series: vec![Series {
                name: "shedder".into(),
                points,
            }],
            y_max: Some(110.0),
            hlines: Vec::new(),
        };
        let factors = [1.0, 2.0, 3.0, 5.0, 10.0, 20.0];
        let ok = panel(factors.iter().map(|&f| (f, 100.0)).collect());
        chart_log_x(&path, "log", "× capacity", &[ok]).expect("chart");
        assert!(std::fs::read(&path).is_ok_and(|png| png.starts_with(b"\x89PNG")));
        assert!(chart_log_x(&path, "bad", "x", &[panel(vec![(0.0, 1.0)])]).is_err());
        assert_eq!(log_tick(&0.0), "1");
        assert_eq!(log_tick(&2f64.log2()), "2");
        assert_eq!(log_tick(&20f64.log2()), "20");
    }
}
