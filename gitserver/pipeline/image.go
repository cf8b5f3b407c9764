package pipeline

import (
	"context"
	"fmt"
	"io"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// CauseImage: an image from a registry was deployed as it is (deploy:image).
const CauseImage Cause = "image"

// ImageRequest is a deploy of an image from a registry.
type ImageRequest struct {
	App string
	// Image is the reference as the user gave it: a tag or a digest, from any
	// registry.
	Image string
	// Actor is the user who asked.
	Actor string
}

// ErrNoImages: DeployImage was given no ImageImporter (this server pulls nothing).
var ErrNoImages error = &backend.Error{Kind: backend.Invalid, Msg: "this server does not deploy images from registries"}

// DeployImage deploys an image from a registry as a release of req.App, the way
// a push deploys a build: under the app's push lock (a push or deploy of the
// app waits, and this waits for them), the image pulled into the app's image
// repository (from), then a release recorded (cause Image) and awaited, and
// withdrawn when it does not serve, the previous release serving on. It
// differs from a push only in where the image comes from: there is no build,
// so no Procfile (the image's own command runs as web, the only process type),
// no app.json, no release command, postdeploy script or cron jobs (the
// release clears the ones the last push brought; a rollback to that push's
// release brings them back). Progress lines go to progress as a push's do.
func (p *Pipeline) DeployImage(ctx context.Context, req ImageRequest, from ImageImporter, progress io.Writer) (*DeployResult, error) {
	if !appv1.ValidAppName(req.App) {
		return nil, fmt.Errorf("%w: %q is not an app name", ErrAppNotFound, req.App)
	}
	if _, err := p.apps.App(ctx, req.App); err != nil {
		return nil, err
	}
	if from == nil {
		return nil, ErrNoImages
	}
	// As for a push: the pull writes to the state dir's disk.
	if err := p.CheckDisk("deploy the image again"); err != nil {
		p.log.Warn("deploy:image refused", "app", req.App, "reason", err)
		return nil, err
	}
	out := NewPlainOutput(progress)
	log := p.log.With("app", req.App, "cause", CauseImage, "actor", req.Actor, "image", req.Image)
	unlock, err := p.lockForDeploy(ctx, req.App, fmt.Sprintf("a deploy of %s by %s", req.Image, req.Actor), out)
	if err != nil {
		return nil, err
	}
	defer unlock()

	out.Step("Pulling %s", req.Image)
	image, err := from.Import(ctx, req.App, req.Image, out)
	if err != nil {
		log.Info("deploy:image", "result", "refused", "reason", err)
		out.Fail("%v", err)
		out.Fail("Nothing changed on %s: %s.", req.App, p.serving(ctx, req.App))
		// Its kind stays the importer's (no such image, a registry out of
		// reach); where it stopped is the fetch.
		return nil, backend.StoppedAt(err, backend.Stop{Phase: backend.PhaseFetch})
	}
	out.Step("Releasing %s", image)
	res := p.releaseAndAwait(ctx, ReleaseRequest{
		App: req.App, Image: image, Actor: req.Actor, Cause: CauseImage,
		Description: "Deploy image " + req.Image,
		// The image's own command as web, and no other type: a Procfile's
		// commands were the pushed code's, not this image's.
		Processes: map[string][]string{},
	}, out, log, JobResult{})
	if res.Reason != "" {
		log.Info("deploy:image", "result", "failed", "reason", res.Reason)
		if res.Cancelled && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, failedDeploy(res)
	}
	log.Info("deploy:image", append([]any{"result", "deployed", "release", res.Release, "pulled", image}, res.Timings...)...)
	return &DeployResult{Release: res.Release, URL: res.URL}, nil
}
