// Package bmc benchmarks the BareMetalHost controller against many
// simulated BMCs (make bench-bmc; the benchmark is behind the bench build
// tag, so make test does not run it).
package bmc
