package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"bex.co/bex/deployer/runtime"
)

var _ runtime.Images = (*Runtime)(nil)

// RemoveImages deletes from the registry the manifests of the images remove
// names (<repo>@sha256:...), unless keep names the same digest, when
// Config.RegistryDelete is set (otherwise it does nothing). It speaks the OCI
// distribution API: DELETE /v2/<name>/manifests/<digest>, which in CNCF
// distribution also removes the tags on that digest. Only repository repo is
// asked: a reference of another repository is ignored, and the same digest in
// another repository is another link there, left as it is. The blobs stay on
// the registry's disk until its garbage collection (registry garbage-collect,
// infra/bex/registry.yaml's CronJob) sweeps what no manifest references. A
// pod still running the image keeps it (the node has pulled it), so nothing
// is reported in use. A manifest already gone is no error; a registry that
// refuses deletes (storage.delete.enabled off) is one.
func (r *Runtime) RemoveImages(ctx context.Context, repo string, remove, keep []string) ([]string, error) {
	if !r.cfg.RegistryDelete || repo == "" || len(remove) == 0 {
		return nil, nil
	}
	rp, err := r.repository(repo)
	if err != nil {
		return nil, err
	}
	kept := map[string]bool{}
	for _, ref := range keep {
		if d, ok := repoDigest(repo, ref); ok {
			kept[d] = true
		}
	}
	var doomed []string
	for _, ref := range remove {
		if d, ok := repoDigest(repo, ref); ok && !kept[d] && !slices.Contains(doomed, d) {
			doomed = append(doomed, d)
		}
	}
	return nil, r.deleteManifests(ctx, rp, doomed)
}

// RemoveRepository deletes every manifest of repository repo, when
// Config.RegistryDelete is set: those its tags name (the builds, tagged by
// commit) and those refs name (the releases; a manifest is reachable by digest
// without a tag). A repository the registry does not know is no error.
func (r *Runtime) RemoveRepository(ctx context.Context, repo string, refs []string) (bool, error) {
	if !r.cfg.RegistryDelete || repo == "" {
		return false, nil
	}
	rp, err := r.repository(repo)
	if err != nil {
		return false, err
	}
	var digests []string
	add := func(d string) {
		if !slices.Contains(digests, d) {
			digests = append(digests, d)
		}
	}
	for _, ref := range refs {
		if d, ok := repoDigest(repo, ref); ok {
			add(d)
		}
	}
	opts := r.remoteOptions(ctx)
	tags, err := remote.List(rp, opts...)
	if err != nil && !notFound(err) {
		return false, fmt.Errorf("listing the tags of %s: %w", repo, err)
	}
	for _, tag := range tags {
		desc, err := remote.Head(rp.Tag(tag), opts...)
		if notFound(err) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("reading %s:%s: %w", repo, tag, err)
		}
		add(desc.Digest.String())
	}
	return false, r.deleteManifests(ctx, rp, digests)
}

// deleteManifests deletes each digest's manifest from rp.
func (r *Runtime) deleteManifests(ctx context.Context, rp name.Repository, digests []string) error {
	opts := r.remoteOptions(ctx)
	var errs []error
	for _, d := range digests {
		err := remote.Delete(rp.Digest(d), opts...)
		var terr *transport.Error
		switch {
		case err == nil, notFound(err):
		case errors.As(err, &terr) && terr.StatusCode == http.StatusMethodNotAllowed:
			return fmt.Errorf("the registry %s refuses to delete manifests: enable storage.delete.enabled (REGISTRY_STORAGE_DELETE_ENABLED=true)", rp.RegistryStr())
		default:
			errs = append(errs, fmt.Errorf("deleting %s@%s: %w", rp.Name(), d, err))
		}
	}
	return errors.Join(errs...)
}

// repository parses repo, plain HTTP when Config.RegistryInsecure.
func (r *Runtime) repository(repo string) (name.Repository, error) {
	var opts []name.Option
	if r.cfg.RegistryInsecure {
		opts = append(opts, name.Insecure)
	}
	rp, err := name.NewRepository(repo, opts...)
	if err != nil {
		return name.Repository{}, fmt.Errorf("image repository %q: %w", repo, err)
	}
	return rp, nil
}

func (r *Runtime) remoteOptions(ctx context.Context) []remote.Option {
	kc := authn.Keychain(anonymous{})
	if r.cfg.RegistryConfig != "" {
		kc = ConfigKeychain(r.cfg.RegistryConfig)
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc)}
}

// notFound reports a 404 of the registry: the manifest or repository is gone.
func notFound(err error) bool {
	var terr *transport.Error
	return errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound
}

// repoDigest is the digest of ref when ref is <repo>@<digest>.
func repoDigest(repo, ref string) (string, bool) {
	d, ok := strings.CutPrefix(ref, repo+"@")
	return d, ok && strings.HasPrefix(d, "sha256:")
}

type anonymous struct{}

func (anonymous) Resolve(authn.Resource) (authn.Authenticator, error) { return authn.Anonymous, nil }

// ConfigKeychain reads credentials from a Docker-style config.json (its
// "auths"), as the builder's --registry-config: read at each use, so that a
// changed file (a rotated Secret) takes effect without a restart. No file
// (""): anonymous. The gitserver's copies into the registry (deploy:image)
// use it too.
type ConfigKeychain string

func (k ConfigKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if k == "" {
		return authn.Anonymous, nil
	}
	f, err := os.Open(string(k))
	if err != nil {
		return nil, fmt.Errorf("registry credentials: %w", err)
	}
	defer f.Close()
	cf, err := dockerconfig.LoadFromReader(f)
	if err != nil {
		return nil, fmt.Errorf("registry credentials in %s: %w", string(k), err)
	}
	ac, err := cf.GetAuthConfig(res.RegistryStr())
	if err != nil {
		return nil, fmt.Errorf("registry credentials in %s: %w", string(k), err)
	}
	if ac.Username == "" && ac.Password == "" && ac.Auth == "" && ac.IdentityToken == "" && ac.RegistryToken == "" {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(authn.AuthConfig{Username: ac.Username, Password: ac.Password, Auth: ac.Auth,
		IdentityToken: ac.IdentityToken, RegistryToken: ac.RegistryToken}), nil
}
