package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	gossh "golang.org/x/crypto/ssh"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/buildslot"
)

// Builder turns one commit of an app's repository into an image.
type Builder interface {
	// Build builds req.Commit of the bare repository at req.RepoDir and returns the
	// image. It writes progress to progress as lines, while it happens. It returns
	// when the image is stored or the build failed; when ctx ends (the pusher left,
	// the build timed out) it stops the build and returns ctx's error. A failure's
	// text is shown to the pusher, so it says what went wrong in their terms.
	Build(ctx context.Context, req BuildRequest, progress io.Writer) (*BuildResult, error)
}

// BuildRequest is one build.
type BuildRequest struct {
	App     string
	RepoDir string
	Commit  string // full hex object id
	Branch  string
	NoCache bool // push option no-cache
	// Slot is the build's hold on one of the pipeline's build slots, held
	// when Build is called. The builder may give it back while it waits for
	// something other than its own work, and must hold it again before it
	// goes on.
	Slot *buildslot.Slot
}

// BuildResult is what a build produced.
type BuildResult struct {
	// Image is a digest-pinned reference.
	Image string
	// Processes are the process types found (Procfile): name → command.
	Processes map[string][]string
	// Release, Postdeploy and FirstPostdeploy are the commit's release command
	// (the Procfile's release:), postdeploy script (app.json's
	// scripts.dokku.postdeploy) and first deploy's postdeploy script (app.json's
	// scripts.postdeploy), as argv; nil without one.
	Release, Postdeploy, FirstPostdeploy []string
	// AppJSON is what the commit's app.json set; nil without one.
	AppJSON *AppJSON
}

// AppJSON is what an app.json sets beside the scripts.
type AppJSON struct {
	// Formation maps process types to their quantity.
	Formation map[string]int32
	// HealthCheck is the web process's startup check; nil without one.
	HealthCheck *appv1.HealthCheck
	// Cron are the app's scheduled jobs.
	Cron []appv1.CronJob
	// Env are the config vars app.json gives, set on the app's first deploy
	// where it does not set them.
	Env []EnvDefault
}

// EnvDefault is a config var of app.json's env: Value, or a secret the
// deployer makes (Secret).
type EnvDefault struct {
	Name, Value string
	Secret      bool
}

// MissingConfigError is a Builder's error (errors.As) for a commit whose
// app.json requires config vars the app does not set: the push is refused
// before anything is built, and the ref does not move.
type MissingConfigError struct {
	App   string
	Names []string
}

func (e *MissingConfigError) Error() string {
	vars, it := "var "+e.Names[0], "it"
	assign := e.Names[0] + "=..."
	if len(e.Names) > 1 {
		vars, it = "vars "+strings.Join(e.Names, ", "), "them"
		assign = strings.Join(e.Names, "=... ") + "=..."
	}
	return fmt.Sprintf("app.json requires config %s, which %s does not set: set %s with config:set %s %s, then push again", vars, e.App, it, e.App, assign)
}

// ErrReleaseCommandFailed is matched (errors.Is) by a Deployer's Release error when
// the release command failed: the release was recorded as failed and the App's
// spec did not move.
var ErrReleaseCommandFailed = errors.New("release command failed")

// ErrPredeployFailed is matched (errors.Is) by a Builder's error when app.json's
// scripts.dokku.predeploy, the image's last build step, failed.
var ErrPredeployFailed = errors.New("predeploy failed")

// ErrPostdeployFailed is matched (errors.Is) by a Deployer's WaitRollout error
// when app.json's scripts.dokku.postdeploy failed once the release served: the
// release was recorded as failed, and the App went back to the release that
// served before it (which serves again when WaitRollout returns).
var ErrPostdeployFailed = errors.New("postdeploy failed")

// Releaser records releases and rolls them out: the deployer's release
// recorder, which cmd/bex wires.
type Releaser interface {
	// Release records a new release of app running the built image and points the
	// App at it. It returns the release number. It fails without side effects when
	// the App cannot be updated.
	Release(ctx context.Context, req ReleaseRequest) (int64, error)
	// WaitRollout waits until release number of app serves on all its instances and
	// returns the app's URL, writing progress lines to progress. It returns an error
	// saying why when the rollout fails (the previous release keeps serving), or
	// ctx's error when ctx ends first.
	WaitRollout(ctx context.Context, app string, number int64, progress io.Writer) (url string, err error)
	// Serving returns the number of the release of app that serves, 0 when none
	// has served yet: what a failure says keeps serving.
	Serving(ctx context.Context, app string) (int64, error)
}

// ReleaseRequest is a release to record.
type ReleaseRequest struct {
	App    string
	Image  string
	Commit string
	// Description, when not empty, is the release's line for people (the
	// deployer makes one from the commit otherwise).
	Description string
	// Processes are the process types of the build; nil keeps the App's.
	Processes map[string][]string
	// Actor is the user who pushed, or who or what asked for the deploy.
	Actor string
	// Cause is what asked for it: a push, a webhook, a user's deploy.
	Cause Cause
	// Delivery is the webhook delivery id, for CauseWebhook.
	Delivery string
	// Release, Postdeploy, FirstPostdeploy and AppJSON are the build's
	// (BuildResult); nil scripts remove the App's, nil AppJSON sets nothing.
	Release, Postdeploy, FirstPostdeploy []string
	AppJSON                              *AppJSON
	// Progress receives the release command's output while it runs.
	Progress io.Writer
}

// ImageImporter brings an image from a registry into an app's image repository, for
// DeployImage (deploy:image): cmd/bex wires builder/imageimport.
type ImageImporter interface {
	// Import resolves ref (a tag or a digest, from any registry this server may
	// reach) and copies the image where the app's releases' images live,
	// writing progress lines to progress. It returns the copy's digest-pinned
	// reference. Its errors carry the backend's kinds and say, in the user's
	// terms, what was wrong with ref (NotFound: no such image; Invalid: not a
	// reference, a registry refused or out of reach, no login).
	Import(ctx context.Context, app, ref string, progress io.Writer) (image string, err error)
}

// UpstreamAuth gives the fetch of an app's upstream what it authenticates with:
// the backend's secrets (hooksecrets.Upstreams), which cmd/bex wires with
// WithUpstreamAuth. Without one, ssh upstreams are not fetched and https ones
// anonymously.
type UpstreamAuth interface {
	// DeployKey returns app's own deploy key, the key its ssh upstreams are
	// fetched with; it is made when app has none yet.
	DeployKey(ctx context.Context, app string) (gossh.Signer, error)
	// Credentials returns the username and password app's https upstream is
	// fetched with (http basic auth); ok is false when none are kept.
	Credentials(ctx context.Context, app string) (username, password string, ok bool, err error)
}

// AppReader reads the apps the pipeline deploys (gitserver.Directory is one).
type AppReader interface {
	// App returns an app, or ErrAppNotFound.
	App(ctx context.Context, name string) (*App, error)
}

// App is what the gitserver and its pipeline need to know of an app.
type App struct {
	Name string
	// DeployBranch is the branch whose pushes deploy; empty until the first push.
	DeployBranch string
	// Members may push besides admins.
	Members []string
}

// ErrAppNotFound is an app's lookup's error when there is no such app
// (gitserver.Directory, AppReader).
var ErrAppNotFound error = &backend.Error{Kind: backend.NotFound, Msg: "app not found"}
