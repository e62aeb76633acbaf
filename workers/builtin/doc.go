// Package builtin holds the work types every workmesh binary serves:
// echo, sha256 and sleep, a registry of them (NewRegistry) and their
// traits by name (Catalog: all three may be hedged and are deterministic).
//
// It imports the workers vocabulary and the standard library only.
package builtin
