//! `weft bench plot` (and `bench serve --plot`): the latency-vs-throughput chart of one or more
//! `bench serve` sweeps as a PNG. Left panel: median TPOT against aggregate output tokens/s;
//! right panel: median TTFT against the same axis; one line per sweep, each point labelled with
//! its concurrency. The font is embedded, so the chart renders the same on a bare machine.

use anyhow::{bail, Context, Result};
use clap::Args;
use plotters::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct BenchPlotArgs {
    /// `bench serve --json` result files; each becomes one line on the chart.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Where to write the PNG.
    #[arg(long, short)]
    output: PathBuf,
    /// Chart title (default: the input lengths of the first file).
    #[arg(long)]
    title: Option<String>,
}

/// One sweep: its legend label and, per concurrency level, (concurrency, out tok/s, TPOT p50 ms,
/// TTFT p50 ms). Levels with no completed request are left out.
pub struct Series {
    pub label: String,
    pub points: Vec<(u64, f64, f64, f64)>,
}

impl Series {
    /// Reads a `bench serve` result document; `fallback` labels it when the document has no
    /// `label` field (the model name is used before that).
    pub fn from_doc(doc: &Value, fallback: &str) -> Result<Series> {
        let results = doc["results"].as_array().context("no `results` array (not a `bench serve --json` file?)")?;
        let label = doc["label"].as_str().or(doc["model"].as_str()).unwrap_or(fallback).to_string();
        let points = results
            .iter()
            .filter_map(|l| Some((l["concurrency"].as_u64()?, l["output_tokens_per_s"].as_f64()?, l["tpot_ms"]["median"].as_f64()?, l["ttft_ms"]["median"].as_f64()?)))
            .filter(|p| p.1.is_finite() && p.2.is_finite() && p.3.is_finite())
            .collect();
        Ok(Series { label, points })
    }
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Both only fail on a malformed font, and these are the crate's own bytes.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold());
    });
}

/// Axis range with a margin, starting at zero (throughput and latency are both ≥ 0).
fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let max = values.fold(0.0f64, f64::max);
    0.0..if max > 0.0 { max * 1.12 } else { 1.0 }
}

/// Draws the chart into `path` (PNG, 1600×700).
pub fn draw(series: &[Series], title: &str, path: &Path) -> Result<()> {
    if series.iter().all(|s| s.points.is_empty()) {
        bail!("nothing to plot: no concurrency level completed a request");
    }
    register_font();
    let root = BitMapBackend::new(path, (1600, 700)).into_drawing_area();
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let root = root.titled(title, ("sans-serif", 26).into_font().style(FontStyle::Bold)).map_err(|e| fail(&e))?;
    let (left, right) = root.split_horizontally(800);
    let x = range(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let panels: [(_, &str, fn(&(u64, f64, f64, f64)) -> f64); 2] = [(left, "median TPOT (ms per output token)", |p| p.2), (right, "median TTFT (ms)", |p| p.3)];
    for (area, y_label, y_of) in panels {
        let y = range(series.iter().flat_map(|s| s.points.iter().map(y_of)));
        let mut chart = ChartBuilder::on(&area).margin(20).x_label_area_size(50).y_label_area_size(70).build_cartesian_2d(x.clone(), y).map_err(|e| fail(&e))?;
        chart.configure_mesh().x_desc("aggregate output tokens/s").y_desc(y_label).label_style(("sans-serif", 16)).axis_desc_style(("sans-serif", 18)).draw().map_err(|e| fail(&e))?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = s.points.iter().map(|p| (p.1, y_of(p))).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))
                .map_err(|e| fail(&e))?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 5, color.filled()))).map_err(|e| fail(&e))?;
            chart
                .draw_series(s.points.iter().map(|p| EmptyElement::at((p.1, y_of(p))) + Text::new(format!("c={}", p.0), (8, -20), ("sans-serif", 15).into_font().color(&BLACK))))
                .map_err(|e| fail(&e))?;
        }
        chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).label_font(("sans-serif", 16)).background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// The default title: input/output lengths of a result document.
pub fn title_of(doc: &Value) -> String {
    format!("weft bench serve: {} input / {} output tokens", doc["input_len"], doc["output_len"])
}

pub fn run(a: BenchPlotArgs) -> Result<()> {
    let mut series = vec![];
    let mut first: Option<Value> = None;
    for p in &a.inputs {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let doc: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", p.display()))?;
        let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        series.push(Series::from_doc(&doc, &stem).with_context(|| p.display().to_string())?);
        first.get_or_insert(doc);
    }
    let title = a.title.clone().unwrap_or_else(|| title_of(first.as_ref().unwrap_or(&Value::Null)));
    draw(&series, &title, &a.output)?;
    eprintln!("wrote {}", a.output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn draws_a_png_from_a_sweep_and_refuses_an_empty_one() {
        let doc = json!({"model": "m", "input_len": 1024, "output_len": 400, "results": [
            {"concurrency": 1, "output_tokens_per_s": 118.0, "tpot_ms": {"median": 8.5}, "ttft_ms": {"median": 40.0}},
            {"concurrency": 8, "output_tokens_per_s": 266.0, "tpot_ms": {"median": 29.0}, "ttft_ms": {"median": 120.0}},
            {"concurrency": 32, "output_tokens_per_s": null, "tpot_ms": {"median": null}, "ttft_ms": {"median": null}},
        ]});
        let s = Series::from_doc(&doc, "x").unwrap();
        assert_eq!(s.label, "m");
        assert_eq!(s.points.len(), 2, "a level with no completed request is left out");
        let dir = std::env::temp_dir().join(format!("weft-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("sweep.png");
        draw(&[s], &title_of(&doc), &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 10_000, "a chart with axes and text, not a blank image ({} bytes)", bytes.len());
        let empty = Series::from_doc(&json!({"results": []}), "e").unwrap();
        assert!(draw(&[empty], "t", &dir.join("e.png")).is_err());
        assert!(Series::from_doc(&json!({"x": 1}), "e").is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
