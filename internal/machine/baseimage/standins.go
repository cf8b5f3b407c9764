package baseimage

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultCacheDir is where the stand-ins are kept between runs: machine-wide and
// outside any clone of the repository, so that a fresh clone (CI's) reuses them.
const DefaultCacheDir = "/var/cache/bex/baseimage"

// Names are the containerd image names the stand-ins are imported as: what the
// plans' FROM lines name when they are pointed at them (plan.Config.Images).
type Names struct {
	// Debian stands in for debian:bookworm-slim. No plan starts from it since the
	// Procfile-only base became the stack; tests and Dockerfiles may.
	Debian string
	// Stack stands in for the base of a Procfile-only app (buildpack-deps:scm,
	// as Heroku's stack): python3, perl, ruby, bash, curl, git, CA certificates,
	// time zones and the common C libraries.
	Stack string
	// Ruby stands in for ruby:*-slim-bookworm and Composer-less Ruby apps:
	// Debian's ruby and bundler, GEM_HOME /usr/local/bundle as the official image
	// has it, and Debian's rails, puma and rack installed as system gems, for apps
	// whose gems cannot be fetched from RubyGems.
	Ruby string
	// PHP stands in for php:*-cli-bookworm and composer:2: Debian's php-cli with
	// the common extensions, and composer.
	PHP string
	// Node stands in for node:*-bookworm-slim: Debian's nodejs and npm, and the
	// node user (uid 1000) with its home /home/node.
	Node string
	// Go stands in for golang:*-bookworm: this machine's Go toolchain in
	// /usr/local/go, GOPATH /go.
	Go string
	// Python stands in for python:*-slim-bookworm: Debian's python3 with pip
	// and venv, as python and pip too.
	Python string
	// Runtime stands in for gcr.io/distroless/static-debian12: CA certificates,
	// time zones, /etc/passwd with nobody, and no shell.
	Runtime string
	// Postgres stands in for postgres:15, the server of managed Postgres
	// databases: Debian's PostgreSQL 15 (server and client programs) and a
	// docker-entrypoint.sh that initialises the data directory from
	// POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB as the official image's
	// does (servers.go).
	Postgres string
	// Redis stands in for redis:7, the server of managed Redis databases:
	// Debian's redis-server and redis-cli, and a docker-entrypoint.sh that runs
	// the server as the redis user in a data directory it owns.
	Redis string
}

// DefaultNames are names of their own, not the official images' (the stand-ins
// are not those images: Debian's Node is 18, the official tag says 22), on a
// registry host that does not exist, so that nothing is ever pulled for them.
func DefaultNames() Names {
	return Names{
		Debian:   "bex-base.local/debian:bookworm",
		Stack:    "bex-base.local/stack:bookworm",
		Ruby:     "bex-base.local/ruby:bookworm",
		PHP:      "bex-base.local/php:bookworm",
		Node:     "bex-base.local/node:bookworm",
		Go:       "bex-base.local/golang:bookworm",
		Python:   "bex-base.local/python:bookworm",
		Runtime:  "bex-base.local/static:bookworm",
		Postgres: "bex-base.local/postgres:15",
		Redis:    "bex-base.local/redis:7",
	}
}

// Config says where the stand-ins come from and where they are kept.
type Config struct {
	// CacheDir keeps the images built, one OCI layout per image under a key of
	// its content (DefaultCacheDir).
	CacheDir string
	// Suite is the Debian release the root file systems are made of.
	Suite string
	// Sources are the apt sources mmdebstrap installs from (one-line style). The
	// packages on them change with Debian's updates: a stand-in in the cache is
	// rebuilt when its key (the sources, packages, hooks and Go version) changes,
	// not when Debian publishes an update.
	Sources []string
	// GoRoot is the Go toolchain copied into the golang stand-in.
	GoRoot string
	// LocalCAs are CA certificates (PEM, named *.crt) that the stand-ins with CA
	// certificates (node, golang, python, and so the runtime) trust besides
	// Debian's: by default those this machine trusts locally, in
	// /usr/local/share/ca-certificates (Debian's place for them). A machine whose
	// way out goes through a TLS-inspecting proxy has its CA there, and a build
	// step (npm ci, go mod download) needs it as much as the host does.
	LocalCAs []string
	// Mmdebstrap is the mmdebstrap program (apt-get install mmdebstrap).
	Mmdebstrap string
	// Names are the images' names in containerd.
	Names Names
	// Progress, when set, receives what is built and mmdebstrap's output.
	Progress io.Writer
	// Kinds, when set, are the only stand-ins Build makes and returns (and
	// those they are picked from): the one-node cluster needs the postgres and
	// redis ones alone (hack/clusterlocal). Empty: all of them.
	Kinds []string
}

// DefaultConfig builds from Debian's own mirror, with the Go toolchain this
// process runs with.
func DefaultConfig() Config {
	return Config{
		CacheDir: DefaultCacheDir,
		Suite:    "bookworm",
		Sources: []string{
			"deb http://deb.debian.org/debian bookworm main",
			"deb http://deb.debian.org/debian bookworm-updates main",
			"deb http://deb.debian.org/debian-security bookworm-security main",
		},
		GoRoot:     "/usr/local/go",
		LocalCAs:   localCAs(),
		Mmdebstrap: "mmdebstrap",
		Names:      DefaultNames(),
	}
}

// Validate reports every field that is unset.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct{ name, v string }{
		{"CacheDir", c.CacheDir}, {"Suite", c.Suite}, {"GoRoot", c.GoRoot}, {"Mmdebstrap", c.Mmdebstrap},
		{"Names.Debian", c.Names.Debian}, {"Names.Stack", c.Names.Stack}, {"Names.Ruby", c.Names.Ruby},
		{"Names.PHP", c.Names.PHP}, {"Names.Node", c.Names.Node}, {"Names.Go", c.Names.Go},
		{"Names.Python", c.Names.Python}, {"Names.Runtime", c.Names.Runtime},
		{"Names.Postgres", c.Names.Postgres}, {"Names.Redis", c.Names.Redis},
	} {
		if f.v == "" {
			errs = append(errs, fmt.Errorf("baseimage: Config.%s is empty", f.name))
		}
	}
	if len(c.Sources) == 0 {
		errs = append(errs, errors.New("baseimage: Config.Sources is empty"))
	}
	if c.CacheDir != "" && !filepath.IsAbs(c.CacheDir) {
		errs = append(errs, fmt.Errorf("baseimage: Config.CacheDir %q is not an absolute path", c.CacheDir))
	}
	return errors.Join(errs...)
}

// localCAs are the certificates this machine trusts locally, as
// update-ca-certificates finds them.
func localCAs() []string {
	found, _ := filepath.Glob("/usr/local/share/ca-certificates/*.crt")
	more, _ := filepath.Glob("/usr/local/share/ca-certificates/*/*.crt")
	return append(found, more...)
}

// trustHook puts the local CAs into the root file system and makes them part of
// its bundle (/etc/ssl/certs/ca-certificates.crt); nothing without any.
func (c Config) trustHook() []string {
	if len(c.LocalCAs) == 0 {
		return nil
	}
	cmd := `mkdir -p "$1/usr/local/share/ca-certificates/bex" && cp`
	for _, f := range c.LocalCAs {
		cmd += " " + shellQuote(f)
	}
	return []string{cmd + ` "$1/usr/local/share/ca-certificates/bex/" && chroot "$1" update-ca-certificates`}
}

// standIn is how one image is made: a Debian root file system with packages,
// changed by hooks (shell commands, the root file system in "$1"), or (from)
// files picked out of another stand-in.
type standIn struct {
	kind     string
	packages []string
	hooks    []string
	// essentialHooks run once the Essential packages are installed and before
	// the others are: to configure how those install (dpkg's path filters,
	// a package's own configuration file that its postinst reads).
	essentialHooks []string
	env            []string
	workdir        string
	cmd            []string
	// stopSignal is the image's STOPSIGNAL, when not SIGTERM.
	stopSignal string
	// from names the stand-in whose files pick chooses.
	from string
	pick func(name string) bool
}

const basePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// standIns are the images, in the order they are built (a `from` comes after the
// image it picks from).
func (c Config) standIns(goVersion string) []standIn {
	goroot := shellQuote(filepath.Clean(c.GoRoot))
	trust := c.trustHook()
	return []standIn{
		// As debian:bookworm-slim: minbase, no docs.
		{kind: "debian", env: []string{basePath}, cmd: []string{"bash"}},
		// As Heroku's stack image, for apps that bring only a Procfile: the
		// interpreters and tools a Procfile's commands call (python3, perl, ruby,
		// bash, curl, git), CA certificates, time zones, and the C libraries that
		// programs and language packages link with (TLS, libffi, zlib, YAML, XML,
		// PostgreSQL's and SQLite's clients).
		{kind: "stack", packages: []string{
			"python3", "perl", "ruby", "curl", "git", "ca-certificates", "tzdata", "netbase", "procps",
			"libssl3", "libffi8", "zlib1g", "libyaml-0-2", "libxml2", "libxslt1.1", "libpq5", "libsqlite3-0",
		},
			hooks: trust, env: []string{basePath, "LANG=C.UTF-8"}, cmd: []string{"bash"}},
		// As ruby:*-slim-bookworm: ruby, gem and bundle on PATH, GEM_HOME and
		// Bundler's config in /usr/local/bundle (the official image's layout, which
		// the Ruby plan relies on), writable by root only. Debian's rails, puma,
		// rack and webrick come installed as system gems, which Bundler uses
		// when it installs with --local: RubyGems cannot be reached from every
		// build, and a Rails app does not fit in a repository's vendor/cache. No
		// compiler: gems with C code that Debian does not ship do not install here
		// (the official slim image has none either).
		{kind: "ruby", packages: []string{
			"ruby", "ruby-bundler", "ruby-rails", "puma", "ruby-rack", "ruby-webrick", "ruby-sqlite3",
			"ca-certificates", "tzdata", "netbase", "git",
		},
			hooks: append([]string{`mkdir -p "$1/usr/local/bundle/bin" && chmod 755 "$1/usr/local/bundle"`}, trust...),
			env: []string{
				"PATH=/usr/local/bundle/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"LANG=C.UTF-8", "GEM_HOME=/usr/local/bundle", "BUNDLE_SILENCE_ROOT_WARNING=1", "BUNDLE_APP_CONFIG=/usr/local/bundle",
			},
			cmd: []string{"irb"}},
		// As php:*-cli-bookworm, and composer:2 for the install stage: php with
		// the extensions most apps ask for, composer, and unzip and git for its
		// downloads.
		{kind: "php", packages: []string{
			"php-cli", "php-mbstring", "php-xml", "php-curl", "php-sqlite3", "php-zip", "php-intl", "php-bcmath",
			"composer", "unzip", "git", "ca-certificates", "tzdata", "netbase",
		},
			hooks: trust, env: []string{basePath, "LANG=C.UTF-8", "COMPOSER_ALLOW_SUPERUSER=1"}, cmd: []string{"php", "-a"}},
		// As node:*-bookworm-slim: node and npm on PATH, yarn 1 as yarn (Debian
		// calls it yarnpkg; the official image has yarn 1 too), the node user (uid
		// and gid 1000, home /home/node, shell bash) that the plans run the app as.
		// Debian's nodejs trusts the system's CA bundle, hence ca-certificates. No
		// corepack: Debian's nodejs 18 leaves it out, so the pnpm and Yarn 2+ plans
		// (corepack enable) do not build on this stand-in.
		{kind: "node", packages: []string{"nodejs", "npm", "yarnpkg", "ca-certificates"},
			hooks: append([]string{
				`[ -e "$1/usr/bin/yarn" ] || ln -s yarnpkg "$1/usr/bin/yarn"`,
				`chroot "$1" groupadd --gid 1000 node`,
				`chroot "$1" useradd --uid 1000 --gid node --shell /bin/bash --create-home node`,
			}, trust...),
			env: []string{basePath}, cmd: []string{"node"}},
		// As golang:*-bookworm: the toolchain in /usr/local/go, GOPATH /go
		// writable by anyone, git and CA certificates for module downloads.
		// GOPROXY and GOFLAGS are not set: Go's defaults (proxy.golang.org) apply,
		// or what a build sets. No C compiler: the plans build with CGO_ENABLED=0.
		{kind: "golang", packages: []string{"ca-certificates", "git", "tzdata", "netbase"},
			hooks: append([]string{
				// Go's own tests (test/) are left out: 21 MB nothing builds with.
				`mkdir -p "$1/usr/local/go" && tar -C ` + goroot + ` --exclude=./test -cf - . | tar -C "$1/usr/local/go" -xf -`,
				`mkdir -p "$1/go/src" "$1/go/bin" && chmod -R 1777 "$1/go"`,
			}, trust...),
			env: []string{
				"GOLANG_VERSION=" + strings.TrimPrefix(goVersion, "go"), "GOTOOLCHAIN=local", "GOPATH=/go",
				"PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			},
			workdir: "/go", cmd: []string{"bash"}},
		// As python:*-slim-bookworm: python and pip by those names, pip installing
		// into the system's site-packages as the official image lets it (Debian's
		// EXTERNALLY-MANAGED marker, which refuses that, is removed).
		{kind: "python", packages: []string{"python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates", "netbase", "tzdata"},
			hooks: append([]string{
				`rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED`,
				`[ -e "$1/usr/bin/pip" ] || ln -s pip3 "$1/usr/bin/pip"`,
			}, trust...),
			env: []string{basePath, "LANG=C.UTF-8"}, cmd: []string{"python3"}},
		// As distroless static: the CA certificates and time zones of the golang
		// stand-in, /etc/passwd with root, nobody and nonroot, /tmp; no shell.
		{kind: "runtime", from: "golang", pick: func(name string) bool {
			return name == "etc/ssl/certs/ca-certificates.crt" || strings.HasPrefix(name, "usr/share/zoneinfo/") ||
				name == "etc/os-release" || name == "usr/lib/os-release"
		},
			env: []string{basePath, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}},
		postgresStandIn(),
		redisStandIn(),
	}
}

// Image is one stand-in, built and in the cache.
type Image struct {
	// Kind is debian, stack, ruby, php, node, golang, python, runtime, postgres
	// or redis.
	Kind string
	// Name is its name in containerd (from Config.Names).
	Name string
	// Digest is its manifest's digest.
	Digest string
	// Layout is its OCI layout in the cache.
	Layout string
	// Built says it was built by this call, not found in the cache.
	Built bool
}

func (n Names) of(kind string) string {
	return map[string]string{
		"debian": n.Debian, "stack": n.Stack, "ruby": n.Ruby, "php": n.PHP, "node": n.Node, "golang": n.Go,
		"python": n.Python, "runtime": n.Runtime, "postgres": n.Postgres, "redis": n.Redis,
	}[kind]
}

// Build makes the stand-ins that the cache lacks and returns all of them. The
// cache is locked meanwhile: another process building the same waits, then finds
// them built.
func Build(ctx context.Context, c Config) ([]Image, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	goVersion, err := os.ReadFile(filepath.Join(c.GoRoot, "VERSION"))
	if err != nil {
		return nil, fmt.Errorf("baseimage: the Go toolchain for the golang stand-in: %w", err)
	}
	gov, _, _ := strings.Cut(string(goVersion), "\n")
	if err := os.MkdirAll(c.CacheDir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockDir(c.CacheDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	keys := map[string]string{}
	built := map[string]Image{}
	var out []Image
	all := c.standIns(gov)
	wanted := c.selected(all)
	for _, s := range all {
		if !wanted[s.kind] {
			continue
		}
		key := c.key(s, gov, keys[s.from])
		keys[s.kind] = key
		img := Image{Kind: s.kind, Name: c.Names.of(s.kind), Layout: filepath.Join(c.CacheDir, s.kind+"-"+key[:16])}
		if d, err := os.ReadFile(img.Layout + ".digest"); err == nil {
			img.Digest = strings.TrimSpace(string(d))
		} else {
			began := time.Now()
			c.say("baseimage: building the %s stand-in (key %s)", s.kind, key[:16])
			if img.Digest, err = c.build(ctx, s, img.Layout, built[s.from]); err != nil {
				return nil, fmt.Errorf("baseimage: the %s stand-in: %w", s.kind, err)
			}
			img.Built = true
			c.say("baseimage: built the %s stand-in in %s", s.kind, time.Since(began).Round(time.Second))
		}
		built[s.kind] = img
		out = append(out, img)
	}
	return out, nil
}

// selected are the kinds of all that Build makes: Kinds and those they are
// picked from (a `from` comes before the image that picks from it), or all.
func (c Config) selected(all []standIn) map[string]bool {
	wanted := map[string]bool{}
	for i := len(all) - 1; i >= 0; i-- {
		if s := all[i]; len(c.Kinds) == 0 || slices.Contains(c.Kinds, s.kind) || wanted[s.kind] {
			wanted[s.kind] = true
			if s.from != "" {
				wanted[s.from] = true
			}
		}
	}
	return wanted
}

// key is a digest of everything that makes the image: a change to any of them
// builds it again. What the code does beyond these (the runtime's pick, the image
// config's other fields) is covered by "format": bump it when that changes.
func (c Config) key(s standIn, goVersion, fromKey string) string {
	doc := map[string]any{
		"format": 1, "kind": s.kind, "suite": c.Suite, "sources": c.Sources,
		"packages": s.packages, "hooks": s.hooks, "env": s.env, "workdir": s.workdir, "cmd": s.cmd,
		"from": fromKey, "options": mmdebstrapOptions,
	}
	if s.kind == "golang" {
		doc["go"] = goVersion
	}
	// Only when set: the keys of the images without them stay as they were, and
	// so do the caches that hold them.
	if len(s.essentialHooks) > 0 {
		doc["essentialHooks"] = s.essentialHooks
	}
	if s.stopSignal != "" {
		doc["stopSignal"] = s.stopSignal
	}
	// The CAs by content: a renewed one builds the images that hold it again.
	if t := c.trustHook(); len(t) == 0 || !slices.Contains(s.hooks, t[0]) {
		return digestOf(doc)
	}
	var cas []string
	for _, f := range c.LocalCAs {
		data, err := os.ReadFile(f)
		if err != nil {
			cas = append(cas, f+": "+err.Error())
			continue
		}
		sum := sha256.Sum256(data)
		cas = append(cas, hex.EncodeToString(sum[:]))
	}
	doc["cas"] = cas
	return digestOf(doc)
}

func digestOf(doc map[string]any) string {
	data, _ := json.Marshal(doc)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// mmdebstrapOptions keep the root file systems small: the minbase variant (the
// Essential and required packages, apt), /usr merged by mmdebstrap's own hook
// (else init-system-helpers brings the usrmerge package, and with it perl: 46 MB
// of the 120 the debian stand-in weighed), no recommended packages, no manuals,
// docs (but the copyrights) nor translations, and no device nodes in /dev (the
// runtime makes /dev).
var mmdebstrapOptions = []string{
	"--variant=minbase",
	"--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
	"--skip=output/dev",
	`--aptopt=APT::Install-Recommends "false"`,
	"--dpkgopt=path-exclude=/usr/share/man/*",
	"--dpkgopt=path-exclude=/usr/share/info/*",
	"--dpkgopt=path-exclude=/usr/share/doc/*",
	"--dpkgopt=path-include=/usr/share/doc/*/copyright",
	"--dpkgopt=path-exclude=/usr/share/locale/*",
	"--dpkgopt=path-exclude=/usr/share/lintian/*",
}

// build makes s's image into layout (which must not exist yet) and returns its
// manifest digest. The work happens in a directory beside it, renamed into place
// once complete: an interrupted build leaves no half image in the cache.
func (c Config) build(ctx context.Context, s standIn, dst string, from Image) (string, error) {
	tmp, err := os.MkdirTemp(c.CacheDir, ".build-"+s.kind+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	layer := filepath.Join(tmp, "layer.tar.gz")
	if s.from != "" {
		err = pickLayer(from.Layout, layer, s.pick)
	} else {
		err = c.rootfsLayer(ctx, s, tmp, layer)
	}
	if err != nil {
		return "", err
	}
	l, err := tarball.LayerFromFile(layer)
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return "", err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env, cf.Config.Cmd, cf.Config.WorkingDir, cf.Config.StopSignal = s.env, s.cmd, s.workdir, s.stopSignal
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	dir := filepath.Join(tmp, "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": s.kind})); err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	// The digest file, beside the layout and written last, says the layout is
	// complete (one left without it by a crash is built again).
	if err := os.RemoveAll(dst); err != nil {
		return "", err
	}
	if err := os.Rename(dir, dst); err != nil {
		return "", err
	}
	return d.String(), os.WriteFile(dst+".digest", []byte(d.String()+"\n"), 0o644)
}

// rootfsLayer runs mmdebstrap for s and compresses the root file system it makes
// into layer: compressed once, here, so that the layout takes the bytes as they
// are.
func (c Config) rootfsLayer(ctx context.Context, s standIn, tmp, layer string) error {
	rootfs := filepath.Join(tmp, "rootfs.tar")
	args := append([]string{}, mmdebstrapOptions...)
	if len(s.packages) > 0 {
		args = append(args, "--include="+strings.Join(s.packages, ","))
	}
	for _, h := range s.essentialHooks {
		args = append(args, "--essential-hook="+h)
	}
	for _, h := range s.hooks {
		args = append(args, "--customize-hook="+h)
	}
	args = append(append(args, c.Suite, rootfs), c.Sources...)
	cmd := exec.CommandContext(ctx, c.Mmdebstrap, args...)
	// mmdebstrap's temporary root goes beside the cache, not in a small /tmp.
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if c.Progress != nil {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(&log, c.Progress), io.MultiWriter(&log, c.Progress)
	}
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("%s not found: apt-get install mmdebstrap (hack/tools.sh installs it)", c.Mmdebstrap)
		}
		return fmt.Errorf("mmdebstrap: %w\n%s", err, tail(log.String(), 40))
	}
	in, err := os.Open(rootfs)
	if err != nil {
		return err
	}
	defer in.Close()
	return writeGzip(layer, func(w io.Writer) error { _, err := io.Copy(w, in); return err })
}

// pickLayer writes the entries of the golang (or another) stand-in's layer that
// pick chooses, plus the distroless-like users and /tmp, as the layer of a new
// image.
func pickLayer(fromLayout, layer string, pick func(string) bool) error {
	p, err := layout.FromPath(fromLayout)
	if err != nil {
		return err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return err
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		return fmt.Errorf("%s: want one image in the layout (%v)", fromLayout, err)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	return writeGzip(layer, func(w io.Writer) error {
		tw := tar.NewWriter(w)
		mtime := time.Unix(0, 0)
		dirs := map[string]bool{}
		mkdir := func(name string, mode int64) error {
			if dirs[name] {
				return nil
			}
			dirs[name] = true
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: mtime})
		}
		file := func(name string, data string) error {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mtime}); err != nil {
				return err
			}
			_, err := io.WriteString(tw, data)
			return err
		}
		for _, step := range []error{
			mkdir("etc", 0o755), mkdir("tmp", 0o1777), mkdir("root", 0o700), mkdir("home", 0o755), mkdir("home/nonroot", 0o700),
			file("etc/passwd", "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"),
			file("etc/group", "root:x:0:\nnogroup:x:65534:\nnonroot:x:65532:\n"),
			file("etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n"),
		} {
			if step != nil {
				return step
			}
		}
		for _, l := range layers {
			rc, err := l.Uncompressed()
			if err != nil {
				return err
			}
			tr := tar.NewReader(rc)
			for {
				hdr, err := tr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					rc.Close()
					return err
				}
				name := strings.TrimPrefix(strings.TrimPrefix(hdr.Name, "./"), "/")
				if !pick(strings.TrimSuffix(name, "/")) && !pick(name) {
					continue
				}
				// The directories above a picked entry first.
				if err := mkdirs(tw, dirs, filepath.Dir(strings.TrimSuffix(name, "/")), mtime); err != nil {
					rc.Close()
					return err
				}
				hdr.Name = name
				if hdr.Typeflag == tar.TypeDir {
					if dirs[strings.TrimSuffix(name, "/")] {
						continue
					}
					dirs[strings.TrimSuffix(name, "/")] = true
				}
				if hdr.Typeflag == tar.TypeLink {
					hdr.Linkname = strings.TrimPrefix(strings.TrimPrefix(hdr.Linkname, "./"), "/")
				}
				if err := tw.WriteHeader(hdr); err != nil {
					rc.Close()
					return err
				}
				if _, err := io.Copy(tw, tr); err != nil {
					rc.Close()
					return err
				}
			}
			rc.Close()
		}
		return tw.Close()
	})
}

// mkdirs writes the directories of the path d that are not written yet, parents
// first.
func mkdirs(tw *tar.Writer, dirs map[string]bool, d string, mtime time.Time) error {
	if d == "." || d == "/" || d == "" || dirs[d] {
		return nil
	}
	if err := mkdirs(tw, dirs, filepath.Dir(d), mtime); err != nil {
		return err
	}
	dirs[d] = true
	return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime})
}

// writeGzip writes what fill writes, gzip-compressed (fast: the layers are built
// once per machine and read from a local disk), to path.
func writeGzip(path string, fill func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw, err := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if err != nil {
		f.Close()
		return err
	}
	if err := fill(zw); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Import builds what the cache lacks (Build), then imports each stand-in into
// cl's namespace under its name. An image already there with the same digest is
// left as it is: a second run takes seconds.
//
// The images are not unpacked here. BuildKit, which is what uses most of them,
// extracts a base's layers into snapshots of its own (named apart from
// containerd's, buildkit-layer-snapshot-v1-…) and never reads containerd's; the
// runtime unpacks the images it runs (the database servers') when it first
// starts one. Unpacking all of them here took 87% of an import (28 s to import
// the ten, 3 min 5 s more to unpack them, on a loaded 2-core machine), before
// any build could start.
func Import(ctx context.Context, cl *containerd.Client, c Config) ([]Image, error) {
	imgs, err := Build(ctx, c)
	if err != nil {
		return nil, err
	}
	for _, img := range imgs {
		if err := importLayout(ctx, cl, img); err != nil {
			return nil, fmt.Errorf("baseimage: import the %s stand-in as %s: %w", img.Kind, img.Name, err)
		}
	}
	return imgs, nil
}

func importLayout(ctx context.Context, cl *containerd.Client, img Image) error {
	is := cl.ImageService()
	if have, err := is.Get(ctx, img.Name); err == nil && have.Target.Digest.String() == img.Digest {
		return nil
	} else if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarDirTo(pw, img.Layout)) }()
	// The layout names its image by kind only (org.opencontainers.image.ref.name):
	// it is imported under the name the caller configured, so that the cache is
	// the same whatever the names.
	got, err := cl.Import(ctx, pr, containerd.WithImageRefTranslator(func(string) string { return img.Name }))
	pr.CloseWithError(err)
	if err != nil {
		return err
	}
	var target *images.Image
	for i := range got {
		if got[i].Name == img.Name {
			target = &got[i]
		}
	}
	if target == nil {
		return fmt.Errorf("containerd imported %v, not %s", got, img.Name)
	}
	return nil
}

// lockDir takes an exclusive flock on dir/.lock, waiting for it.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

func (c Config) say(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, format+"\n", args...)
	}
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
