// Package tests holds workmesh's multi-node and black-box tests, fault drills and benchmarks against baselines.
package tests
