package main

import (
	"context"
	"errors"
	"io"
	"net/netip"

	"bex.co/bex/builder/imageimport"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/gitserver/upstream"
)

// imageImporter is builder/imageimport as the pipeline (Import) and the
// backend (CheckLogin) call it: its errors given the backend's kinds.
type imageImporter struct{ im *imageimport.Importer }

func (i imageImporter) Import(ctx context.Context, app, ref string, progress io.Writer) (string, error) {
	res, err := i.im.Import(ctx, app, ref, progress)
	if err != nil {
		return "", importError(err)
	}
	return res.Image, nil
}

func (i imageImporter) CheckLogin(ctx context.Context, host, username, password string) error {
	return importError(i.im.CheckLogin(ctx, host, username, password))
}

// importError gives an importer's error its kind: no such image is NotFound;
// a bad reference, a registry out of reach or wanting a login is the user's
// to fix (Invalid); anything else (the registry down, the disk) Failed.
func importError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, imageimport.ErrNotFound):
		return &backend.Error{Kind: backend.NotFound, Msg: err.Error(), Err: err}
	case errors.Is(err, imageimport.ErrInvalid), errors.Is(err, imageimport.ErrUnauthorized), errors.Is(err, imageimport.ErrRefused):
		return &backend.Error{Kind: backend.Invalid, Msg: err.Error(), Err: err}
	case errors.Is(err, context.Canceled):
		return err
	}
	return &backend.Error{Kind: backend.Failed, Msg: err.Error(), Err: err}
}

// imageDeployer is the pipeline's DeployImage as the backend calls it.
type imageDeployer struct {
	p      *pipeline.Pipeline
	images pipeline.ImageImporter
}

func (d imageDeployer) DeployImage(ctx context.Context, req backend.ImageRequest) (*backend.DeployResult, error) {
	res, err := d.p.DeployImage(ctx, pipeline.ImageRequest{App: req.App, Image: req.Image, Actor: req.Actor}, d.images, req.Progress)
	if err != nil {
		return nil, err
	}
	return &backend.DeployResult{Release: res.Release, URL: res.URL}, nil
}

// registryBlocked is what deploy:image may not pull from: the addresses no
// upstream may be on (upstream.Blocked: loopback, private, link-local,
// metadata, ...), checked at each dial; nil with --allow-private-registries.
func registryBlocked(allowPrivate bool) func(netip.Addr) string {
	if allowPrivate {
		return nil
	}
	return upstream.Blocked
}

// importer is i as the pipeline's Images, nil when deploy:image is off (a
// nil interface, not a nil importer in one).
func (i imageImporter) importer() pipeline.ImageImporter {
	if i.im == nil {
		return nil
	}
	return i
}
