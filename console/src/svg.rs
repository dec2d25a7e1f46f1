//! Charts as server-rendered SVG: one value per minute, as bars or lines, with no
//! script. Every text goes through [`esc`], so a chart is well-formed XML.

use std::fmt::Write;

use crate::html::esc;

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 150.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 22.0;
const BOTTOM: f64 = 18.0;

/// How a chart draws its series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Side by side bars per minute (counts per minute).
    Bars,
    /// A line per series (a level over time), broken where a minute has no value.
    Lines,
}

/// One series of a chart: a value per minute (`None`: no value).
pub struct Series<'a> {
    /// Its name in the legend.
    pub label: &'a str,
    /// Its colour (a CSS colour).
    pub color: &'static str,
    /// The values, oldest minute first.
    pub values: &'a [Option<u64>],
}

fn f(x: f64) -> String {
    format!("{x:.1}")
}

/// A chart of `series` over as many minutes as they have values, labelled `title`,
/// values on the axis written by `unit`.
pub fn chart(title: &str, kind: Kind, series: &[Series<'_>], unit: fn(u64) -> String) -> String {
    let minutes = series
        .iter()
        .map(|s| s.values.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .copied()
        .max();
    let top = max.unwrap_or(0).max(1);
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let slot = plot_w / minutes as f64;
    let y = |v: u64| TOP + plot_h - v as f64 * plot_h / top as f64;
    let x = |i: usize| LEFT + i as f64 * slot;
    let mut b = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         role=\"img\" aria-label=\"{t}\"><title>{t}</title>",
        t = esc(title)
    );
    let bottom = f(TOP + plot_h);
    let _ = write!(
        b,
        "<line x1=\"{l}\" y1=\"{bottom}\" x2=\"{r}\" y2=\"{bottom}\" stroke=\"#999\"/>\
         <line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{bottom}\" stroke=\"#999\"/>\
         <text x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\" font-size=\"10\">{max}</text>\
         <text x=\"{lx}\" y=\"{bottom}\" text-anchor=\"end\" font-size=\"10\">{zero}</text>\
         <text x=\"{l}\" y=\"{HEIGHT}\" font-size=\"10\">-{minutes} min</text>\
         <text x=\"{r}\" y=\"{HEIGHT}\" text-anchor=\"end\" font-size=\"10\">now</text>",
        l = f(LEFT),
        r = f(WIDTH - RIGHT),
        t = f(TOP),
        lx = f(LEFT - 4.0),
        ty = f(TOP + 8.0),
        max = esc(&unit(top)),
        zero = esc(&unit(0)),
    );
    for (j, s) in series.iter().enumerate() {
        let lx = LEFT + j as f64 * 120.0;
        let _ = write!(
            b,
            "<rect x=\"{}\" y=\"6\" width=\"10\" height=\"10\" fill=\"{c}\"/>\
             <text x=\"{}\" y=\"15\" font-size=\"11\">{}</text>",
            f(lx),
            f(lx + 14.0),
            esc(s.label),
            c = s.color
        );
    }
    if max.is_none() {
        let _ = write!(
            b,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\" fill=\"#777\">\
             no two samples yet</text>",
            f(LEFT + plot_w / 2.0),
            f(TOP + plot_h / 2.0)
        );
    }
    match kind {
        Kind::Bars => bars(&mut b, series, minutes, slot, &x, &y, unit),
        Kind::Lines => lines(&mut b, series, minutes, slot, &x, &y, unit),
    }
    b.push_str("</svg>");
    b
}

/// `value at minute i` for a tooltip.
fn tip(s: &Series<'_>, i: usize, minutes: usize, v: u64, unit: fn(u64) -> String) -> String {
    let ago = minutes - 1 - i;
    let when = if ago == 0 {
        "this minute".to_owned()
    } else {
        format!("{ago} min ago")
    };
    esc(&format!("{}: {} ({when})", s.label, unit(v)))
}

fn bars(
    b: &mut String,
    series: &[Series<'_>],
    minutes: usize,
    slot: f64,
    x: &dyn Fn(usize) -> f64,
    y: &dyn Fn(u64) -> f64,
    unit: fn(u64) -> String,
) {
    let width = slot * 0.8 / series.len().max(1) as f64;
    for (j, s) in series.iter().enumerate() {
        for (i, v) in s.values.iter().enumerate() {
            let Some(v) = *v else { continue };
            let top = y(v);
            let _ = write!(
                b,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}</title></rect>",
                f(x(i) + slot * 0.1 + j as f64 * width),
                f(top),
                f(width),
                f(y(0) - top),
                s.color,
                tip(s, i, minutes, v, unit)
            );
        }
    }
}

fn lines(
    b: &mut String,
    series: &[Series<'_>],
    minutes: usize,
    slot: f64,
    x: &dyn Fn(usize) -> f64,
    y: &dyn Fn(u64) -> f64,
    unit: fn(u64) -> String,
) {
    for s in series {
        let mut run: Vec<String> = Vec::new();
        let flush = |b: &mut String, run: &mut Vec<String>| {
            if run.len() > 1 {
                let _ = write!(
                    b,
                    "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
                    s.color,
                    run.join(" ")
                );
            }
            run.clear();
        };
        for (i, v) in s.values.iter().enumerate() {
            match *v {
                Some(v) => {
                    let (cx, cy) = (x(i) + slot / 2.0, y(v));
                    run.push(format!("{},{}", f(cx), f(cy)));
                    let _ = write!(
                        b,
                        "<circle cx=\"{}\" cy=\"{}\" r=\"2\" fill=\"{}\"><title>{}</title></circle>",
                        f(cx),
                        f(cy),
                        s.color,
                        tip(s, i, minutes, v, unit)
                    );
                }
                None => flush(b, &mut run),
            }
        }
        flush(b, &mut run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_bar_per_value_and_escapes_labels() {
        let values = [None, Some(4), Some(0), Some(8)];
        let svg = chart(
            "a <b> & c",
            Kind::Bars,
            &[Series {
                label: "it's",
                color: "#2a7",
                values: &values,
            }],
            |v| v.to_string(),
        );
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.contains("<title>a &lt;b&gt; &amp; c</title>"));
        assert!(svg.contains("it&#39;s"));
        assert_eq!(
            svg.matches("<rect").count(),
            1 + 3,
            "the legend swatch and 3 bars"
        );
        assert!(
            svg.contains(">8</text>"),
            "the axis' top is the largest value"
        );
    }
}
