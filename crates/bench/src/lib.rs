//! Benchmarks of Myriad's layers. Each benchmark prints its figures (and JSON lines with
//! `--json`); none of them is a timed test.
