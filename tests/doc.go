// Package tests holds workmesh's multi-node and black-box tests, fault drills and benchmarks against baselines.
//
// The tests may import every workmesh package, through its exported API only,
// as a program built on workmesh would, and libp2p for the baselines and the
// in-memory mock network. The package has no code outside its tests, and no
// workmesh package may import it.
package tests
