package builder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/exporter/containerimage/exptypes"
	gateway "github.com/moby/buildkit/frontend/gateway/client"
	gwpb "github.com/moby/buildkit/frontend/gateway/pb"
	"github.com/moby/buildkit/session"
	"github.com/moby/buildkit/session/secrets/secretsprovider"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// app.json's scripts.dokku.predeploy is the image's last build step, as Dokku
// runs it: in the built image, as its user, in its working directory, with the
// app's config vars, and what it writes is in the release's image. It is a
// build step like the Dockerfile's: in buildkitd's sandbox (the build steps'
// network, memory and task limits), never taken from the cache (it runs again
// on each build, as a deploy task does), and the image's config (command,
// entrypoint, user, env, working directory) stays the one the Dockerfile made.
//
// The config vars reach it as BuildKit secrets exposed as environment variables
// (an exec's secretenv): their values travel through the build's session, never
// in the build's definition, a cache key, a layer or the image's config, and
// no shell reads them, so a value is never parsed whatever it holds.

// predeploy is one build's predeploy step.
type predeploy struct {
	// command is the script as app.json writes it, for the progress line.
	command string
	// argv runs it: literal words, no $(NAME) left (literalArgv).
	argv []string
	// env are the app's config vars.
	env map[string]string
	// hostname is the build steps' host name (the app's).
	hostname string

	// ran and failed are set by the build function: ran once the step was
	// asked for, failed with its error (a build that failed before it is the
	// Dockerfile's failure).
	ran    bool
	failed error
}

// predeployName is the step's name in the build's progress.
func predeployName(command string) string {
	return "predeploy (app.json scripts.dokku.predeploy): " + oneLine(command)
}

// secretID is the build secret of the i-th config var (in name order).
func secretID(i int) string { return "bex-config-" + strconv.Itoa(i) }

// secrets is the session attachable that serves the config vars.
func (pd *predeploy) secrets() session.Attachable {
	m := make(map[string][]byte, len(pd.env))
	for i, k := range slices.Sorted(maps.Keys(pd.env)) {
		m[secretID(i)] = []byte(pd.env[k])
	}
	return secretsprovider.FromMap(m)
}

// imageConfig is what the step needs of the built image's config.
type imageConfig struct {
	ocispec.Platform
	Config struct {
		User       string   `json:"User"`
		Env        []string `json:"Env"`
		WorkingDir string   `json:"WorkingDir"`
	} `json:"config"`
}

// build is the gateway build function: the Dockerfile frontend builds the image,
// the predeploy step runs on it, and its result is the image, with the
// frontend's config (one more history entry).
func (pd *predeploy) build(attrs map[string]string) gateway.BuildFunc {
	return func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
		res, err := c.Solve(ctx, gateway.SolveRequest{Frontend: "dockerfile.v0", FrontendOpt: attrs})
		if err != nil {
			return nil, err
		}
		ref, err := res.SingleRef()
		if err != nil {
			return nil, err
		}
		if ref == nil {
			return nil, errors.New("the image is empty (FROM scratch and nothing added): scripts.dokku.predeploy has nothing to run in")
		}
		// Built first: a Dockerfile step that fails is the build's failure,
		// not predeploy's.
		if err := ref.Evaluate(ctx); err != nil {
			return nil, err
		}
		rawConfig := res.Metadata[exptypes.ExporterImageConfigKey]
		var img imageConfig
		if err := json.Unmarshal(rawConfig, &img); err != nil {
			return nil, fmt.Errorf("reading the built image's config: %w", err)
		}
		st, err := ref.ToState()
		if err != nil {
			return nil, err
		}
		st = pd.state(st, img)
		opts := []llb.RunOption{llb.Args(pd.argv), llb.IgnoreCache, llb.WithCustomName(predeployName(pd.command))}
		for i, k := range slices.Sorted(maps.Keys(pd.env)) {
			opts = append(opts, llb.AddSecretWithDest(secretID(i), nil, llb.SecretAsEnvName(k)))
		}
		def, err := st.Run(opts...).Root().Marshal(ctx, llb.Platform(img.Platform))
		if err != nil {
			return nil, err
		}
		pd.ran = true
		out, err := c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB()})
		if err == nil {
			var nref gateway.Reference
			if nref, err = out.SingleRef(); err == nil {
				// Run now, not when the image is exported: its failure is
				// predeploy's.
				err = nref.Evaluate(ctx)
				res.SetRef(nref)
			}
		}
		if err != nil {
			pd.failed = err
			return nil, err
		}
		if cfg, err := withHistory(rawConfig, predeployName(pd.command)); err == nil {
			res.AddMeta(exptypes.ExporterImageConfigKey, cfg)
		}
		return res, nil
	}
}

// state is the built image's root as the step runs in it: the image's user,
// working directory and env (without the variables a config var sets, which
// come as secrets), the app's host name.
func (pd *predeploy) state(st llb.State, img imageConfig) llb.State {
	for _, kv := range img.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := pd.env[k]; ok || k == "" {
			continue
		}
		st = st.AddEnv(k, v)
	}
	dir := img.Config.WorkingDir
	if dir == "" {
		dir = "/"
	}
	st = st.Dir(dir).Hostname(pd.hostname)
	if img.Config.User != "" {
		st = st.User(img.Config.User)
	}
	return st
}

// withHistory adds the step to the config's history, every other field kept as
// the frontend wrote it.
func withHistory(raw []byte, createdBy string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	var hist []ocispec.History
	if h, ok := m["history"]; ok {
		if err := json.Unmarshal(h, &hist); err != nil {
			return nil, err
		}
	}
	now := time.Now().UTC()
	hist = append(hist, ocispec.History{Created: &now, CreatedBy: createdBy, Comment: "bex"})
	h, err := json.Marshal(hist)
	if err != nil {
		return nil, err
	}
	m["history"] = h
	return json.Marshal(m)
}

// ErrPredeployFailed is matched (errors.Is) by the error of a build whose
// predeploy step failed.
var ErrPredeployFailed = errors.New("predeploy failed")

// PredeployError is a build whose predeploy step exited non-zero (Status) or
// could not run (Status 0, Err says why).
type PredeployError struct {
	Status int
	Err    error
	// Tail is the step's last output lines.
	Tail []string
}

func (e *PredeployError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("predeploy (app.json scripts.dokku.predeploy) could not run: %v", e.Err)
	}
	return fmt.Sprintf("predeploy (app.json scripts.dokku.predeploy) exited with status %d", e.Status)
}

// Is makes errors.Is(err, ErrPredeployFailed) hold.
func (e *PredeployError) Is(target error) bool { return target == ErrPredeployFailed }

// predeployError is the build's error when its predeploy step failed; nil when
// it did not run or did not fail.
func (pd *predeploy) predeployError(r *renderer) error {
	if pd == nil || !pd.ran || pd.failed == nil {
		return nil
	}
	e := &PredeployError{Err: pd.failed}
	if ee, ok := errors.AsType[*gwpb.ExitError](pd.failed); ok && ee.ExitCode != 0 {
		e.Status = int(ee.ExitCode)
	} else if m := exitCodeRE.FindStringSubmatch(pd.failed.Error()); m != nil {
		e.Status, _ = strconv.Atoi(m[1])
	}
	if _, _, tail, ok := r.failedStep(); ok {
		e.Tail = tail
	}
	return e
}

// literalArgv turns a plan's argv, written for Kubernetes' expansion of a
// container's command ($$ is $, $(NAME) a variable), into the words a build step
// runs: nothing expands there. A $(NAME) that is left (a $NAME of a command
// that runs without a shell) is an error: the config vars reach the step as its
// environment only, never in its command line, where the build's records would
// keep them.
func literalArgv(argv []string) ([]string, error) {
	out := make([]string, len(argv))
	for i, a := range argv {
		var b strings.Builder
		for j := 0; j < len(a); j++ {
			if a[j] != '$' || j+1 == len(a) {
				b.WriteByte(a[j])
				continue
			}
			switch a[j+1] {
			case '$':
				b.WriteByte('$')
				j++
			case '(':
				if end := strings.IndexByte(a[j+2:], ')'); end >= 0 {
					return nil, fmt.Errorf("$%s: the image has no shell, so the command cannot read config vars; run a script that does, or give the image a shell", a[j+2:j+2+end])
				}
				b.WriteByte('$')
			default:
				b.WriteByte('$')
			}
		}
		out[i] = b.String()
	}
	return out, nil
}
