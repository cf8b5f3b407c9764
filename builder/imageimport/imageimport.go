package imageimport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"bex.co/bex/internal/bytesize"
)

// Credentials are the registry logins kept by the platform (registry:login).
type Credentials interface {
	// Registry returns the username and password kept for host, a registry as
	// go-containerregistry names it (host[:port]; index.docker.io for Docker
	// Hub); ok is false when none are kept.
	Registry(ctx context.Context, host string) (username, password string, ok bool, err error)
}

// Config is what an Importer works with; cmd/bex fills it.
type Config struct {
	// ImageRepo names the images of releases, <ImageRepo>/<app>, as the
	// builder's --image-repo. An image named under its registry is refused as a
	// source: that is the platform's own store, with every app's images.
	ImageRepo string
	// Platform is the image an index is resolved to; zero: linux and the
	// architecture bex runs on.
	Platform v1.Platform
	// MaxBytes bounds an image's compressed size (config and layers, as its
	// manifest declares them), checked before anything is copied.
	MaxBytes int64
	// MaxUnpackedBytes bounds what an image's layers unpack to (each layer
	// decompressed and counted, as many times as the manifest lists it),
	// checked before the image is unpacked or tagged: a layer compressed
	// 1000:1 passes MaxBytes and would fill the disk on unpack.
	MaxUnpackedBytes int64
	// Blocked says what an address of a source registry is when it may not be
	// dialled ("a loopback address"), "" when it may; nil: every address may.
	// Checked at each dial, after resolution (upstream.Blocked unless the
	// gitserver runs with --allow-private-registries).
	Blocked func(netip.Addr) string
	// AllowFlag is how an admin lifts Blocked, for the refusal's sentence.
	AllowFlag string
	// Credentials are the source registries' logins; nil: anonymous.
	Credentials Credentials
	// RootCAs verify the source registries' TLS certificates; nil: the
	// system's roots.
	RootCAs *x509.CertPool
	// Timeout bounds one import.
	Timeout time.Duration
	// StallTimeout ends an import whose registry sends nothing for that long
	// while a response (a blob mid-way, above all) is read.
	StallTimeout time.Duration

	// DiskDir, on one machine, is a directory on the disk the image goes to
	// (the state dir, which holds containerd's); "" checks nothing. An image
	// whose compressed size, then (counted before anything is unpacked) what
	// its layers unpack to, does not fit above the margin is refused, and an
	// import stops when the disk falls under the margin while it pulls or
	// unpacks, as a build does.
	DiskDir string
	// MinFreeBytes and MinFreePercent are that margin: the smaller of
	// MinFreeBytes and MinFreePercent of the disk's size; either one 0 turns
	// the checks off. No default: the margin has one owner, the gitserver's
	// pipeline (--min-free-disk), and cmd/bex gives it here.
	MinFreeBytes   int64
	MinFreePercent float64

	// Containerd, on one machine, is where the image goes: pulled into
	// Namespace and unpacked with Snapshotter, as BuildKit's worker stores a
	// build.
	Containerd  *containerd.Client
	Namespace   string
	Snapshotter string
	// Push, on a cluster, copies the image into ImageRepo's registry, with
	// PushKeychain's credentials (the builder's --registry-config), over plain
	// HTTP when PushInsecure.
	Push         bool
	PushKeychain authn.Keychain
	PushInsecure bool
}

// DefaultConfig returns the defaults of the settings that have one.
func DefaultConfig() Config {
	return Config{
		ImageRepo: "bex.local",
		MaxBytes:  8 << 30,
		// Ordinary layers compress 2-4:1 (gzip of binaries and text), so 4x
		// MaxBytes takes any image MaxBytes does but a bomb's (1000:1).
		MaxUnpackedBytes: 32 << 30,
		Timeout:          30 * time.Minute,
		StallTimeout:     2 * time.Minute,
		Namespace:        "bex",
		Snapshotter:      "overlayfs",
		AllowFlag:        "bex gitserver --allow-private-registries",
	}
}

// The kinds of an Import's or CheckLogin's errors, matched with errors.Is.
var (
	// ErrInvalid: the reference is not one, names bex's own store, or the image
	// is not one bex can run (no manifest for the platform, too large).
	ErrInvalid = errors.New("invalid image")
	// ErrNotFound: the registry has no such repository, tag or digest.
	ErrNotFound = errors.New("image not found")
	// ErrUnauthorized: the registry wants credentials, or refused the ones kept.
	ErrUnauthorized = errors.New("registry refused access")
	// ErrRefused: the registry is on an address deploy:image may not reach.
	ErrRefused = errors.New("registry address refused")
)

// Error is an error of one of the kinds above; its text is one sentence for
// the user, without the kind's name.
type Error struct {
	kind error
	msg  string
}

func (e *Error) Error() string        { return e.msg }
func (e *Error) Is(target error) bool { return target == e.kind }

func errorf(kind error, format string, args ...any) error {
	return &Error{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// Importer copies images from registries into the app's repository.
type Importer struct {
	cfg    Config
	client *http.Client // the source registries': every dial checked
	own    string       // the registry of ImageRepo
}

// New checks cfg and returns an Importer.
func New(cfg Config) (*Importer, error) {
	if cfg.ImageRepo == "" {
		return nil, errors.New("imageimport: Config.ImageRepo is required")
	}
	if (cfg.Containerd == nil) == !cfg.Push {
		return nil, errors.New("imageimport: give Config.Containerd (one machine) or Config.Push (a cluster), one of them")
	}
	if cfg.MaxBytes <= 0 || cfg.MaxUnpackedBytes <= 0 || cfg.Timeout <= 0 || cfg.StallTimeout <= 0 {
		return nil, errors.New("imageimport: Config.MaxBytes, Config.MaxUnpackedBytes, Config.Timeout and Config.StallTimeout must be positive (DefaultConfig has them)")
	}
	if cfg.Platform.OS == "" {
		cfg.Platform = v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}
	}
	ownRepo, err := name.NewRepository(cfg.ImageRepo+"/x", name.WeakValidation)
	if err != nil {
		return nil, fmt.Errorf("imageimport: image repo %q: %w", cfg.ImageRepo, err)
	}
	i := &Importer{cfg: cfg, own: ownRepo.RegistryStr()}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: i.control}
	i.client = &http.Client{Transport: stallTransport{timeout: cfg.StallTimeout, base: &http.Transport{
		// No proxy from the environment: the proxy would dial, unchecked.
		Proxy:                 nil,
		DialContext:           d.DialContext,
		TLSClientConfig:       &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		MaxIdleConns:          8,
		IdleConnTimeout:       30 * time.Second,
	}}}
	return i, nil
}

// refusedError is the dialer's refusal of an address.
type refusedError struct{ addr, what, flag string }

func (e *refusedError) Error() string {
	return fmt.Sprintf("%s is %s, which deploy:image may not pull from (an admin can allow it: %s)", e.addr, e.what, e.flag)
}

func (e *refusedError) Is(target error) bool { return target == ErrRefused }

// control refuses a connection to an address Config.Blocked names; it runs
// for each address a dial tries, after the name was resolved.
func (i *Importer) control(_, address string, _ syscall.RawConn) error {
	if i.cfg.Blocked == nil {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &refusedError{addr: address, what: "not an address", flag: i.cfg.AllowFlag}
	}
	if what := i.cfg.Blocked(ap.Addr().Unmap()); what != "" {
		return &refusedError{addr: ap.Addr().Unmap().String(), what: what, flag: i.cfg.AllowFlag}
	}
	return nil
}

// Result is an imported image.
type Result struct {
	// Image is the digest-pinned reference of the copy: <ImageRepo>/<app>@sha256:...
	Image string
	// Source is what the reference resolved to: REGISTRY/REPOSITORY@sha256:...
	Source string
	// Bytes is the image's compressed size (config and layers).
	Bytes int64
	// Platform is the platform of the image, os/architecture[/variant].
	Platform string
}

// Parse checks that ref is an image reference deploy:image takes, as `docker
// pull` does: [REGISTRY/]REPOSITORY[:TAG|@sha256:DIGEST], Docker Hub when no
// registry is named.
func (i *Importer) Parse(ref string) (name.Reference, error) {
	if ref == "" || len(ref) > 512 || strings.ContainsAny(ref, " \t\r\n") || strings.Contains(ref, "://") {
		return nil, errorf(ErrInvalid, "%q is not an image reference: give one as docker pull takes it, e.g. ghcr.io/org/app:v1 or registry.example/app@sha256:...", ref)
	}
	r, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil {
		return nil, errorf(ErrInvalid, "%q is not an image reference (%v): give one as docker pull takes it, e.g. ghcr.io/org/app:v1", ref, err)
	}
	if r.Context().RegistryStr() == i.own {
		return nil, errorf(ErrInvalid, "%s is in bex's own image store (%s), which holds every app's images: deploy an earlier release of this app with rollback", ref, i.cfg.ImageRepo)
	}
	return r, nil
}

// Import resolves ref (a tag or a digest, from any registry the dialer may
// reach) to one image manifest, for Config.Platform when ref names an index,
// and copies it under app's repository, saying what it does on progress. The
// copy is named <ImageRepo>/<app>:image-<digest prefix>, so that the runtimes'
// pruning of old releases' images covers it as it covers a build's.
func (i *Importer) Import(ctx context.Context, app, ref string, progress io.Writer) (*Result, error) {
	if progress == nil {
		progress = io.Discard
	}
	ctx, cancel := context.WithTimeout(ctx, i.cfg.Timeout)
	defer cancel()
	// A stalled registry or a full disk ends the import with its cause.
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	ctx = withAbort(ctx, abort)
	r, err := i.Parse(ref)
	if err != nil {
		return nil, err
	}
	hadCreds, err := i.hasCredentials(ctx, r.Context().RegistryStr())
	if err != nil {
		return nil, err
	}
	opts := i.sourceOptions(ctx)
	desc, err := remote.Get(r, opts...)
	if errors.Is(context.Cause(ctx), errStalled) {
		return nil, i.stalledError(ref, r.Context().RegistryStr())
	}
	if err != nil {
		return nil, i.explain(ref, r.Context().RegistryStr(), hadCreds, err)
	}
	var img v1.Image
	switch {
	case desc.MediaType.IsIndex():
		img, err = desc.Image() // the child for Config.Platform
		if err != nil {
			return nil, errorf(ErrInvalid, "%s has no image for %s (%v)", ref, platformString(i.cfg.Platform), err)
		}
	case desc.MediaType.IsImage():
		img, err = desc.Image()
		if err != nil {
			return nil, i.explain(ref, r.Context().RegistryStr(), hadCreds, err)
		}
	default:
		return nil, errorf(ErrInvalid, "%s is a %s, not an image bex can run (a Docker v2 or OCI image, or an index of them)", ref, desc.MediaType)
	}
	dgst, err := img.Digest()
	if err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, i.explain(ref, r.Context().RegistryStr(), hadCreds, err)
	}
	size := m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	if size > i.cfg.MaxBytes {
		return nil, errorf(ErrInvalid, "%s is %s, more than the %s an image may be", ref, bytesize.Format(size), bytesize.Format(i.cfg.MaxBytes))
	}
	plat := platformString(i.cfg.Platform)
	if cf, err := img.ConfigFile(); err == nil && cf.OS != "" {
		plat = cf.OS + "/" + cf.Architecture
		if cf.Variant != "" {
			plat += "/" + cf.Variant
		}
		if cf.OS != i.cfg.Platform.OS || cf.Architecture != i.cfg.Platform.Architecture {
			return nil, errorf(ErrInvalid, "%s is an image for %s, and this platform runs %s", ref, plat, platformString(i.cfg.Platform))
		}
	} else if err != nil {
		return nil, i.explain(ref, r.Context().RegistryStr(), hadCreds, err)
	}
	if !i.cfg.Push {
		if err := i.fits(ref, "is", size); err != nil {
			return nil, err
		}
	}
	src := r.Context().Digest(dgst.String())
	fmt.Fprintf(progress, "-----> Resolved %s to %s (%s, %s)\n", ref, src.Name(), plat, bytesize.Format(size))
	res := &Result{
		Image:    fmt.Sprintf("%s/%s@%s", i.cfg.ImageRepo, app, dgst),
		Source:   src.Name(),
		Bytes:    size,
		Platform: plat,
	}
	tag := fmt.Sprintf("%s/%s:image-%s", i.cfg.ImageRepo, app, dgst.Hex[:16])
	start := time.Now()
	if i.cfg.Push {
		err = i.push(ctx, tag, img)
	} else {
		stop := i.watchDisk(ctx, abort)
		err = i.pull(ctx, ref, tag, src)
		lowest, margin := stop()
		if errors.Is(context.Cause(ctx), errDiskFull) {
			return nil, fmt.Errorf("pulling %s stopped: the disk of %s fell to %s free, under the %s bex keeps for the platform and the apps; nothing was kept: free space on that disk and deploy the image again",
				ref, i.cfg.DiskDir, bytesize.Format(int64(lowest)), bytesize.Format(int64(margin)))
		}
	}
	if errors.Is(context.Cause(ctx), errStalled) {
		return nil, i.stalledError(ref, r.Context().RegistryStr())
	}
	var noRoom *Error
	if errors.As(err, &noRoom) {
		return nil, err
	}
	if errors.Is(err, errUnpacksPast) {
		return nil, errorf(ErrInvalid, "%s unpacks to more than %s (its layers expand past the bound an image may unpack to): nothing was unpacked; make its layers smaller", ref, bytesize.Format(i.cfg.MaxUnpackedBytes))
	}
	var bad *badLayerError
	if errors.As(err, &bad) {
		return nil, errorf(ErrInvalid, "%s is not an image bex can run: %v", ref, bad.err)
	}
	if err != nil {
		return nil, i.explain(ref, r.Context().RegistryStr(), hadCreds, err)
	}
	fmt.Fprintf(progress, "       copied in %s\n", time.Since(start).Round(100*time.Millisecond))
	return res, nil
}

// push copies img into the platform's registry as tag (the registry's garbage
// collection keeps tagged manifests only), counting what its layers unpack to
// as they stream: the manifest is written by digest, the layers the write did
// not read (the registry had them) are counted from the registry, and only an
// image within Config.MaxUnpackedBytes is tagged. A refused one leaves
// untagged blobs, and maybe an untagged manifest, to the collection.
func (i *Importer) push(ctx context.Context, tag string, img v1.Image) error {
	var nopts []name.Option
	if i.cfg.PushInsecure {
		nopts = append(nopts, name.Insecure)
	}
	dst, err := name.NewTag(tag, nopts...)
	if err != nil {
		return fmt.Errorf("image name %s: %w", tag, err)
	}
	dgst, err := img.Digest()
	if err != nil {
		return err
	}
	ls, err := img.Layers()
	if err != nil {
		return err
	}
	digests := make([]string, len(ls))
	for n, l := range ls {
		h, err := l.Digest()
		if err != nil {
			return err
		}
		digests[n] = h.String()
	}
	kc := i.cfg.PushKeychain
	if kc == nil {
		kc = authn.NewMultiKeychain()
	}
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithUserAgent("bex")}
	counted := &countedImage{Image: img, budget: newUnpackBudget(i.cfg.MaxUnpackedBytes, digests), stop: stop}
	err = remote.Write(dst.Context().Digest(dgst.String()), counted, opts...)
	if cerr := counted.failed(); cerr != nil {
		return cerr
	}
	if err != nil {
		return &destError{fmt.Errorf("copying into %s: %w", dst.Context().Name(), err)}
	}
	for _, d := range counted.budget.uncounted() {
		if err := i.countStored(dst.Context().Digest(d), counted.budget, opts); err != nil {
			return err
		}
	}
	if err := remote.Tag(dst, img, opts...); err != nil {
		return &destError{fmt.Errorf("tagging %s: %w", dst.Name(), err)}
	}
	return nil
}

// countStored counts a layer the platform's registry has against b.
func (i *Importer) countStored(ref name.Digest, b *unpackBudget, opts []remote.Option) error {
	l, err := remote.Layer(ref, opts...)
	if err != nil {
		return &destError{fmt.Errorf("reading %s: %w", ref.Name(), err)}
	}
	rc, err := l.Compressed()
	if err != nil {
		return &destError{fmt.Errorf("reading %s: %w", ref.Name(), err)}
	}
	defer rc.Close()
	return b.count(ref.DigestStr(), rc)
}

// destError is a failure on the platform's side of a copy: not the source's
// fault, so not explained as one.
type destError struct{ err error }

func (e *destError) Error() string { return e.err.Error() }
func (e *destError) Unwrap() error { return e.err }

// pull fetches src into containerd as tag, counts what its layers unpack to
// from the content store, and unpacks it. containerd's own pull fetches
// (content with its garbage-collection labels), through a resolver that names
// the image tag while it fetches src, over the checked client with the kept
// credentials, under a lease of this import's; an image past
// Config.MaxUnpackedBytes is deleted before anything is unpacked, and the
// lease's deletion collects its content (synchronously: containerd's garbage
// collection runs before pull returns).
func (i *Importer) pull(ctx context.Context, ref, tag string, src name.Digest) (err error) {
	ctx = namespaces.WithNamespace(ctx, i.cfg.Namespace)
	ls := i.cfg.Containerd.LeasesService()
	lease, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(24*time.Hour))
	if err != nil {
		return err
	}
	ctx = leases.WithLease(ctx, lease.ID)
	defer func() {
		var opts []leases.DeleteOpt
		if err != nil {
			opts = append(opts, leases.SynchronousDelete)
		}
		_ = ls.Delete(context.WithoutCancel(ctx), lease, opts...)
	}()
	authorizer := docker.NewDockerAuthorizer(docker.WithAuthClient(i.client), docker.WithAuthCreds(func(host string) (string, string, error) {
		if host == "registry-1.docker.io" {
			host = name.DefaultRegistry
		}
		if i.cfg.Credentials == nil {
			return "", "", nil
		}
		u, p, ok, err := i.cfg.Credentials.Registry(ctx, host)
		if err != nil || !ok {
			return "", "", err
		}
		return u, p, nil
	}))
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(
		docker.WithClient(i.client), docker.WithAuthorizer(authorizer),
		// Plain HTTP for a registry on loopback only (a test's, or one on the
		// machine an admin allowed); every other registry speaks TLS.
		docker.WithPlainHTTP(docker.MatchLocalhost),
	)})
	img, err := i.cfg.Containerd.Pull(ctx, tag,
		containerd.WithResolver(aliasResolver{Resolver: resolver, source: containerdRef(src)}),
		containerd.WithPlatformMatcher(platforms.Only(ocispec.Platform{OS: i.cfg.Platform.OS, Architecture: i.cfg.Platform.Architecture, Variant: i.cfg.Platform.Variant})))
	if err != nil {
		return err
	}
	unpacked, err := i.countUnpacked(ctx, img)
	if err == nil {
		// The layers are in the content store: what they unpack to must fit
		// beside them.
		err = i.fits(ref, "unpacks to", unpacked)
	}
	if err == nil {
		err = img.Unpack(ctx, i.cfg.Snapshotter)
	}
	if err != nil {
		// Refused or not unpacked: no name is left on it (Pull with
		// unpacking would have made none).
		if derr := i.cfg.Containerd.ImageService().Delete(context.WithoutCancel(ctx), tag); derr != nil && !errdefs.IsNotFound(derr) {
			return errors.Join(err, fmt.Errorf("deleting the image %s: %w", tag, derr))
		}
	}
	return err
}

// countUnpacked counts what img's layers unpack to, from the content store,
// against Config.MaxUnpackedBytes, and returns it; an image unpacked already
// (an import again) takes no more room and is not counted again (0).
func (i *Importer) countUnpacked(ctx context.Context, img containerd.Image) (int64, error) {
	if ok, err := img.IsUnpacked(ctx, i.cfg.Snapshotter); err == nil && ok {
		return 0, nil
	}
	cs := img.ContentStore()
	m, err := images.Manifest(ctx, cs, img.Target(), img.Platform())
	if err != nil {
		return 0, err
	}
	var layers []ocispec.Descriptor
	var digests []string
	for _, l := range m.Layers {
		if images.IsLayerType(l.MediaType) { // what Unpack applies
			layers = append(layers, l)
			digests = append(digests, l.Digest.String())
		}
	}
	b := newUnpackBudget(i.cfg.MaxUnpackedBytes, digests)
	seen := map[string]bool{}
	for _, l := range layers {
		if seen[l.Digest.String()] {
			continue
		}
		seen[l.Digest.String()] = true
		ra, err := cs.ReaderAt(ctx, l)
		if err != nil {
			return 0, err
		}
		err = b.count(l.Digest.String(), content.NewReader(ra))
		ra.Close()
		if err != nil {
			return 0, err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total, nil
}

// containerdRef is src as containerd's resolver names it (docker.io for
// Docker Hub, which it maps to registry-1.docker.io).
func containerdRef(src name.Digest) string {
	reg := src.Context().RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	return reg + "/" + src.Context().RepositoryStr() + "@" + src.DigestStr()
}

// aliasResolver resolves and fetches source whatever name it is asked for, so
// that containerd's Pull stores source's content under that name.
type aliasResolver struct {
	remotes.Resolver
	source string
}

func (a aliasResolver) Resolve(ctx context.Context, ref string) (string, ocispec.Descriptor, error) {
	_, desc, err := a.Resolver.Resolve(ctx, a.source)
	return ref, desc, err
}

func (a aliasResolver) Fetcher(ctx context.Context, _ string) (remotes.Fetcher, error) {
	return a.Resolver.Fetcher(ctx, a.source)
}

// CheckLogin tries username and password against host's registry (GET /v2/,
// with a token exchange where the registry asks for one): nil when the
// registry takes them, ErrUnauthorized when it refuses them.
func (i *Importer) CheckLogin(ctx context.Context, host, username, password string) error {
	reg, err := name.NewRegistry(host, name.WeakValidation)
	if err != nil {
		return errorf(ErrInvalid, "%q is not a registry host: give HOST or HOST:PORT, e.g. ghcr.io", host)
	}
	if reg.RegistryStr() == i.own {
		return errorf(ErrInvalid, "%s is bex's own image store: it needs no login", host)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tr, err := transport.NewWithContext(ctx, reg, &authn.Basic{Username: username, Password: password}, i.client.Transport, []string{reg.Scope(transport.PullScope)})
	if err != nil {
		return i.explainLogin(host, username, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s://%s/v2/", reg.Scheme(), reg.RegistryStr()), nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return i.explainLogin(host, username, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return i.explainLogin(host, username, transport.CheckError(resp, http.StatusOK))
}

func (i *Importer) explainLogin(host, username string, err error) error {
	if err == nil {
		return nil
	}
	var refused *refusedError
	if errors.As(err, &refused) {
		return errorf(ErrRefused, "%s: %v", host, refused)
	}
	var terr *transport.Error
	if errors.As(err, &terr) && (terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden) {
		return errorf(ErrUnauthorized, "%s refused the password of %s: check them and log in again", host, username)
	}
	return fmt.Errorf("could not reach the registry %s: %v", host, sanitize(err))
}

func (i *Importer) hasCredentials(ctx context.Context, host string) (bool, error) {
	if i.cfg.Credentials == nil {
		return false, nil
	}
	_, _, ok, err := i.cfg.Credentials.Registry(ctx, host)
	if err != nil {
		return false, fmt.Errorf("reading the login kept for %s: %w", host, err)
	}
	return ok, nil
}

func (i *Importer) sourceOptions(ctx context.Context) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(i.client.Transport),
		remote.WithAuthFromKeychain(keychain{ctx: ctx, creds: i.cfg.Credentials}),
		remote.WithPlatform(i.cfg.Platform),
		remote.WithUserAgent("bex"),
	}
}

// explain turns a registry's error into the sentence the user sees: the
// reference, and what to do. It never quotes a credential: none is in the
// reference or the registry's answers.
func (i *Importer) explain(ref, host string, hadCreds bool, err error) error {
	var dest *destError
	if errors.As(err, &dest) {
		return dest
	}
	var refused *refusedError
	if errors.As(err, &refused) {
		return errorf(ErrRefused, "%s: the registry %s: %v", ref, host, refused)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		codes := map[transport.ErrorCode]bool{}
		for _, d := range terr.Errors {
			codes[d.Code] = true
		}
		switch {
		case terr.StatusCode == http.StatusNotFound || codes[transport.ManifestUnknownErrorCode] || codes[transport.NameUnknownErrorCode]:
			return errorf(ErrNotFound, "%s does not exist in %s: check the name and the tag", ref, host)
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden ||
			codes[transport.UnauthorizedErrorCode] || codes[transport.DeniedErrorCode]:
			if hadCreds {
				return errorf(ErrUnauthorized, "%s refused the login kept for it to pull %s: the image may not exist, or the login lacks access (an admin can log in again: registry:login %s USER --password-stdin)", host, ref, host)
			}
			return errorf(ErrUnauthorized, "%s needs a login to pull %s (or it does not exist): an admin can log in with registry:login %s USER --password-stdin", host, ref, host)
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pulling %s from %s took longer than %s", ref, host, i.cfg.Timeout)
	}
	return fmt.Errorf("pulling %s from %s: %v", ref, host, sanitize(err))
}

// sanitize keeps an error's text from carrying a URL's user information.
func sanitize(err error) string {
	s := err.Error()
	for {
		at := strings.Index(s, "://")
		if at < 0 {
			return s
		}
		rest := s[at+3:]
		end := strings.IndexAny(rest, "/ \"'")
		if end < 0 {
			end = len(rest)
		}
		if u := strings.LastIndex(rest[:end], "@"); u >= 0 {
			s = s[:at+3] + rest[u+1:]
			continue
		}
		return s
	}
}

// keychain gives go-containerregistry the kept login of each registry.
type keychain struct {
	ctx   context.Context
	creds Credentials
}

func (k keychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if k.creds == nil {
		return authn.Anonymous, nil
	}
	u, p, ok, err := k.creds.Registry(k.ctx, res.RegistryStr())
	if err != nil {
		return nil, err
	}
	if !ok {
		return authn.Anonymous, nil
	}
	return &authn.Basic{Username: u, Password: p}, nil
}

func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}
