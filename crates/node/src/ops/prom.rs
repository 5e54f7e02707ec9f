//! Writing metric families through `prometheus-client`'s encoder: a collector that runs a
//! closure at scrape time, and helpers for gauges, counters and histograms with labels.
//!
//! # Invariants
//! - Every family is written once per scrape with all its label sets (the text format
//!   wants a family's samples together); counters get the `_total` suffix from the
//!   encoder, so names here never carry it.
//!
//! # Who calls it
//! [`super::peer_metrics`] and [`super::superpeer_metrics`].

use std::collections::HashMap;
use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::process::ProcessStats;

/// A label set: `(name, value)` pairs.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// One histogram of a family: labels, sum, count and per-bucket `(bound, count)` pairs (not
/// cumulative: the encoder adds them up).
pub(crate) type HistogramRow = (Labels, f64, u64, Vec<(f64, u64)>);

/// Where a collector writes its families during one scrape.
pub(crate) struct Out<'a> {
    encoder: DescriptorEncoder<'a>,
}

impl Out<'_> {
    /// One gauge without labels.
    pub(crate) fn gauge(&mut self, name: &str, help: &str, value: f64) -> fmt::Result {
        let metric = ConstGauge::new(value);
        let encoder = self
            .encoder
            .encode_descriptor(name, help, None, metric.metric_type())?;
        metric.encode(encoder)
    }

    /// One counter without labels (`name` without `_total`).
    pub(crate) fn counter(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let metric = ConstCounter::new(value);
        let encoder = self
            .encoder
            .encode_descriptor(name, help, None, metric.metric_type())?;
        metric.encode(encoder)
    }

    /// A gauge family, one sample per label set (nothing written when `rows` is empty).
    pub(crate) fn gauges(&mut self, name: &str, help: &str, rows: &[(Labels, f64)]) -> fmt::Result {
        if rows.is_empty() {
            return Ok(());
        }
        let mut encoder = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, value) in rows {
            ConstGauge::new(*value).encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    /// A counter family, one sample per label set (nothing written when `rows` is empty).
    pub(crate) fn counters(
        &mut self,
        name: &str,
        help: &str,
        rows: &[(Labels, u64)],
    ) -> fmt::Result {
        if rows.is_empty() {
            return Ok(());
        }
        let mut encoder = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Counter)?;
        for (labels, value) in rows {
            ConstCounter::new(*value).encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    /// A histogram family: per label set the sum, the count and the per-bucket counts
    /// `(upper bound, count)` ending with `+Inf`.
    pub(crate) fn histograms(
        &mut self,
        name: &str,
        help: &str,
        rows: &[HistogramRow],
    ) -> fmt::Result {
        if rows.is_empty() {
            return Ok(());
        }
        let mut encoder =
            self.encoder
                .encode_descriptor(name, help, None, MetricType::Histogram)?;
        for (labels, sum, count, buckets) in rows {
            let no_exemplars: Option<&HashMap<usize, Exemplar<Labels, f64>>> = None;
            encoder
                .encode_family(labels)?
                .encode_histogram(*sum, *count, buckets, no_exemplars)?;
        }
        Ok(())
    }

    /// The process figures every node exports (`process_*`, as Prometheus client
    /// libraries name them).
    pub(crate) fn process(&mut self, stats: &ProcessStats) -> fmt::Result {
        if let Some(cpu) = stats.cpu_seconds {
            let metric = ConstCounter::new(cpu);
            let encoder = self.encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time of the process, in seconds.",
                None,
                metric.metric_type(),
            )?;
            metric.encode(encoder)?;
        }
        if let Some(rss) = stats.resident_bytes {
            self.gauge(
                "process_resident_memory_bytes",
                "Resident memory of the process.",
                rss as f64,
            )?;
        }
        if let Some(virtual_bytes) = stats.virtual_bytes {
            self.gauge(
                "process_virtual_memory_bytes",
                "Virtual memory of the process.",
                virtual_bytes as f64,
            )?;
        }
        if let Some(threads) = stats.threads {
            self.gauge("process_threads", "Threads of the process.", threads as f64)?;
        }
        Ok(())
    }
}

/// A collector that writes its families with a closure when scraped.
struct FnCollector<F>(F);

impl<F> fmt::Debug for FnCollector<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnCollector")
    }
}

impl<F> Collector for FnCollector<F>
where
    F: Fn(&mut Out<'_>) -> fmt::Result + Send + Sync + 'static,
{
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        (self.0)(&mut Out { encoder })
    }
}

/// Runs `write` once and returns the families it wrote in the Prometheus text format.
pub(crate) fn render<F>(write: F) -> String
where
    F: Fn(&mut Out<'_>) -> fmt::Result + Send + Sync + 'static,
{
    let mut registry = Registry::default();
    registry.register_collector(Box::new(FnCollector(write)));
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry) {
        tracing::warn!(%error, "metrics could not be encoded");
    }
    text
}

/// The `Content-Type` of [`render`]'s text.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
