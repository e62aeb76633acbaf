// Package config holds every setting of a workmesh node: the types, their
// defaults, validation, per-work-type resolution and loading from a YAML
// file, WORKMESH_* environment variables and command-line flags (in that
// order of precedence). Every setting has one kebab-case name that is the
// same in all three places: the YAML key, the flag (--worker-timeout) and,
// upper-cased with underscores, the environment variable
// (WORKMESH_WORKER_TIMEOUT). Nested blocks join their names with a dash in
// flags and an underscore in the environment (label-balancing.order is
// --label-balancing-order and WORKMESH_LABEL_BALANCING_ORDER). One name is
// taken: the node's api is WORKMESH_NODE_API, because WORKMESH_API is the
// address the client commands talk to.
//
// Every problem is reported at once, each with the source of its value: the
// file and line, the environment variable or the flag.
//
// config imports no other workmesh package and no libp2p, only the standard
// library and its loading libraries (koanf, pflag, mapstructure, yaml for
// the positions of keys in a file, logrus for the log level), so that every
// workmesh package may import it. What the program around it knows (its
// work types, the variables it reads itself) comes in through LoadOptions.
package config
