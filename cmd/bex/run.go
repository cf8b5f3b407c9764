package main

import (
	"context"

	"bex.co/bex/deployer/runtime"
	"bex.co/bex/gitserver/backend"
)

// oneOffRunner adapts a runtime's OneOffs to the gitserver backend's Runner.
type oneOffRunner struct{ o runtime.OneOffs }

var _ backend.Runner = oneOffRunner{}

func (r oneOffRunner) Run(ctx context.Context, s backend.RunSpec) (int, error) {
	return r.o.Run(ctx, r.oneOff(ctx, s))
}

func (r oneOffRunner) Start(ctx context.Context, s backend.RunSpec, done func(int)) error {
	return r.o.Start(ctx, r.oneOff(ctx, s), done)
}

func (oneOffRunner) oneOff(ctx context.Context, s backend.RunSpec) runtime.OneOff {
	o := runtime.OneOff{App: s.App, ID: s.ID, Process: s.Process, Release: s.Release, Image: s.Image,
		Command: s.Command, Env: s.Env, Resources: s.Resources, Timeout: s.Timeout,
		Stdin: s.Stdin, Stdout: s.Stdout, Stderr: s.Stderr}
	if s.TTY != nil {
		resize := make(chan runtime.WindowSize, 1)
		go func() {
			for {
				select {
				case w, ok := <-s.TTY.Resize:
					if !ok {
						return
					}
					select {
					case resize <- runtime.WindowSize{Width: w.Width, Height: w.Height}:
					case <-ctx.Done():
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
		o.TTY = &runtime.TTY{Term: s.TTY.Term, Width: s.TTY.Width, Height: s.TTY.Height, Resize: resize}
	}
	return o
}
