package builder

import (
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"strings"

	"github.com/distribution/reference"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/solver/errdefs"
	spb "github.com/moby/buildkit/sourcepolicy/pb"
)

// One buildkitd builds every app. What a build keeps in it is its app's alone: its
// cache mounts, its steps' cached results, and the images of the app it may start
// from. See docs/architecture.md, "A build".

// The build arguments bex sets itself, after the app's own (spec.build.args):
// an app's value for one of them is ignored, with a line saying so.
const (
	// argCacheNS namespaces the Dockerfile's cache mounts (dockerui's
	// BUILDKIT_CACHE_MOUNT_NS): `--mount=type=cache,target=/x` and `id=x` become
	// <namespace>/<id> in buildkitd, whatever id the Dockerfile names.
	argCacheNS = "BUILDKIT_CACHE_MOUNT_NS"
	// argHostname is the build steps' host name (dockerui's
	// BUILDKIT_SANDBOX_HOSTNAME). It is in every RUN step's cache key, which is
	// why bex sets it: buildkitd keeps a cache mount's id in the key only for a
	// default, shared mount, and drops it for an explicit id= or a locked or
	// private one; without a per-app host name, a step of one app that read its
	// cache would be taken CACHED for another app's same step.
	argHostname = "BUILDKIT_SANDBOX_HOSTNAME"
	// argSyntax would forward the build to another frontend image (as `#
	// syntax=` does); the cmdline attribute turns both off.
	argSyntax = "BUILDKIT_SYNTAX"
)

// appUIDRE is what an App's metadata.uid looks like (a UUID from the API server),
// and what may go in a cache mount's namespace and a host name: no slash, which
// would let one uid's namespace begin another's.
var appUIDRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z-]{0,62}$`)

// tenantAttrs are the frontend attributes that keep one app's build to itself, set
// over attrs (which hold the app's own build arguments already): cache mounts and
// RUN steps' cache keys in the app's namespace, and the built-in Dockerfile
// frontend only. What sets the namespace apart is the App's uid, not its name, so
// that an app made later under a destroyed app's name never finds its cache. The
// cache mounts' namespace begins with <imageRepo>/<app>/ too, which is how
// system:df tells whose a cache mount's record is (appOfRecord).
func tenantAttrs(attrs map[string]string, imageRepo, app, uid string, out io.Writer) {
	for _, k := range []string{argCacheNS, argHostname, argSyntax} {
		if _, ok := attrs["build-arg:"+k]; ok {
			fmt.Fprintf(out, "-----> The build argument %s is bex's own: the app's value is ignored\n", k)
		}
	}
	delete(attrs, "build-arg:"+argSyntax)
	attrs["build-arg:"+argCacheNS] = imageRepo + "/" + app + "/" + uid
	attrs["build-arg:"+argHostname] = "app-" + uid
	// The Dockerfile frontend forwards the build to the image a `# syntax=`
	// directive or BUILDKIT_SYNTAX names unless cmdline is set (it is how a
	// forwarded frontend is told it was forwarded): with it, the built-in
	// frontend builds, and no other frontend chooses cache ids or sources.
	attrs["cmdline"] = "dockerfile.v0"
}

// syntaxNote is the line that says the Dockerfile's `# syntax=` directive is not
// followed; "" when it has none. The Dockerfile is read through its directory's
// root (the directive is at its top; no more than maxDockerfileHead is read).
func syntaxNote(dir *os.Root, name string) (string, error) {
	f, err := dir.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head, err := io.ReadAll(io.LimitReader(f, maxDockerfileHead))
	if err != nil {
		return "", err
	}
	ref, _, _, ok := parser.DetectSyntax(head)
	if !ok {
		return "", nil
	}
	return fmt.Sprintf("-----> The Dockerfile's syntax directive (%s) is ignored: bex builds with its built-in Dockerfile frontend", oneLine(ref)), nil
}

// maxDockerfileHead bounds what syntaxNote reads of a Dockerfile.
const maxDockerfileHead = 64 << 10

func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return -1
		}
		return r
	}, s)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// sourcePolicy lets a build's images (FROM, COPY --from, RUN --mount from=) be
// base images and the building app's own, never another app's: every source
// under the image repository is denied, then the app's own repository, with a tag
// or a digest, allowed again (buildkitd's Allow and Deny rules: the last matching
// one wins). buildkitd checks it where it resolves an image's metadata and where
// it loads a source, on the identifier it normalised (docker-image://host/path:tag).
// Blobs of a repository (docker-image+blob://, a git bundle's locator) are denied
// whole. The match ignores case: a registry's host name does.
func sourcePolicy(imageRepo, app string) (*spb.Policy, error) {
	repo, err := normalRepo(imageRepo)
	if err != nil {
		return nil, err
	}
	q := regexp.QuoteMeta(repo)
	return &spb.Policy{
		Version: 1,
		Rules: []*spb.Rule{
			{Action: spb.PolicyAction_DENY, Selector: &spb.Selector{
				MatchType:  spb.MatchType_REGEX,
				Identifier: `(?i)^docker-image(\+blob)?://` + q + `/`,
			}},
			{Action: spb.PolicyAction_ALLOW, Selector: &spb.Selector{
				MatchType:  spb.MatchType_REGEX,
				Identifier: `(?i)^docker-image://` + q + `/` + regexp.QuoteMeta(app) + `(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$`,
			}},
		},
	}, nil
}

// normalRepo is imageRepo as buildkitd's identifiers spell it: bex.local stays,
// a name without a host gets docker.io's.
func normalRepo(imageRepo string) (string, error) {
	n, err := reference.ParseNormalizedNamed(imageRepo + "/app")
	if err != nil {
		return "", fmt.Errorf("image repository %q: %w", imageRepo, err)
	}
	return path.Dir(n.Name()), nil
}

// deniedRE is buildkitd's error for a source the policy denies.
var deniedRE = regexp.MustCompile(`source "docker-image(?:\+blob)?://([^"]+)" denied by policy`)

// deniedSource turns buildkitd's denial into the line the pusher reads, naming the
// instruction that asked for the image when buildkitd says which Dockerfile line
// it was (FROM bex.local/other:abc is another app's image: ...); ok is false when
// msg is not a denial.
func deniedSource(err error, msg string) (error, bool) {
	m := deniedRE.FindStringSubmatch(msg)
	if m == nil {
		return nil, false
	}
	what := map[string]string{"FROM": "FROM ", "COPY": "COPY --from=", "RUN": "RUN --mount from="}[instructionOf(err)]
	if what == "" {
		return fmt.Errorf("%s is another app's image: a build starts from base images or this app's own (FROM, COPY --from, RUN --mount from=)", oneLine(m[1])), true
	}
	return fmt.Errorf("%s%s is another app's image: a build starts from base images or this app's own", what, oneLine(m[1])), true
}

// instructionOf is the instruction of the Dockerfile line err comes from, upper
// case, as buildkitd's source location gives it; "" when it gives none.
func instructionOf(err error) string {
	for _, src := range errdefs.Sources(err) {
		if src.Info == nil || len(src.Ranges) == 0 || src.Ranges[0].Start == nil {
			continue
		}
		lines := strings.Split(string(src.Info.Data), "\n")
		if n := int(src.Ranges[0].Start.Line); n >= 1 && n <= len(lines) {
			if f := strings.Fields(lines[n-1]); len(f) > 0 {
				return strings.ToUpper(f[0])
			}
		}
	}
	return ""
}
