package backend

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"slices"
)

// Logs writes what an app's processes print to w (see LogOptions); with
// Follow it returns when ctx ends.
func (b *Backend) Logs(ctx context.Context, u *User, name string, opts LogOptions, w io.Writer) error {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return err
	}
	if opts.Lines < 0 {
		return Errorf(Invalid, "-n %d: give a number of lines from 1 up", opts.Lines)
	}
	if opts.Process != "" && !IsOneOffProcess(opts.Process) {
		if _, ok := a.Spec.Processes[opts.Process]; !ok {
			return noSuchProcess(a, opts.Process)
		}
	}
	if b.cfg.Logs == nil {
		return Errorf(Invalid, "this server cannot read runtime logs")
	}
	if err := b.cfg.Logs.Logs(ctx, a.Name, opts, w); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return Errorf(Invalid, "%v", err)
	}
	return nil
}

// Builds lists an app's recent builds, newest first.
func (b *Backend) Builds(ctx context.Context, u *User, name string) ([]BuildInfo, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	if b.cfg.Builds == nil {
		return nil, Errorf(Invalid, "this server keeps no build logs")
	}
	list, err := b.cfg.Builds.List(a.Name)
	if err != nil {
		return nil, err
	}
	return nonNil(list), nil
}

// BuildLog opens the log of one of an app's builds (id "": the latest) and
// returns its record with it; the caller closes the log.
func (b *Backend) BuildLog(ctx context.Context, u *User, name, id string) (BuildInfo, io.ReadCloser, error) {
	builds, err := b.Builds(ctx, u, name)
	if err != nil {
		return BuildInfo{}, nil, err
	}
	if len(builds) == 0 {
		return BuildInfo{}, nil, Errorf(NotFound, "%s has no builds yet: git push builds it", name)
	}
	bi := builds[0]
	if id != "" {
		i := slices.IndexFunc(builds, func(x BuildInfo) bool { return x.ID == id })
		if i < 0 {
			return BuildInfo{}, nil, Errorf(NotFound, "%s has no build %q (builds %s lists them)", name, id, name)
		}
		bi = builds[i]
	}
	f, err := b.cfg.Builds.Open(name, bi.ID)
	if errors.Is(err, fs.ErrNotExist) {
		return BuildInfo{}, nil, Errorf(NotFound, "%s has no build %q (builds %s lists them)", name, bi.ID, name)
	}
	if err != nil {
		return BuildInfo{}, nil, err
	}
	return bi, f, nil
}
