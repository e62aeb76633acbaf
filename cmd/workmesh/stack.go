package main

import (
	"context"
	"errors"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	wstack "github.com/workmesh/workmesh/workers/stack"
)

// stack is one whole node; workers/stack assembles it, so that a Go
// program embedding workmesh starts the same one.
type stack = wstack.Stack

// withNodeOptions passes options to node.New (devnet mounts its control
// endpoint with one).
var withNodeOptions = wstack.WithNodeOptions

// startStack starts a whole node from cfg with this binary's version; an
// error of the configuration is a usage error (exit 2).
func startStack(ctx context.Context, cfg config.Config, log *logrus.Logger, opts ...stackOption) (*stack, error) {
	s, err := wstack.Start(ctx, cfg, log, append([]wstack.Option{wstack.WithVersion(version)}, opts...)...)
	if errors.Is(err, wstack.ErrUsage) {
		return nil, usageError{err}
	}
	return s, err
}

// knownTypes are the traits of every work type this binary has.
func knownTypes() workers.Catalog { return wstack.KnownTypes() }

// builtinTypes returns the work types of list that are built in.
var builtinTypes = wstack.BuiltinTypes

// stackOption adjusts what startStack starts.
type stackOption = wstack.Option
