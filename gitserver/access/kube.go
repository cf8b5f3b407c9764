package access

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
)

// KeyFingerprintField is the cache's field index on Users: each of a user's keys that
// parses, by its SHA256 fingerprint (gossh.FingerprintSHA256, "SHA256:…"). Other
// readers of the same cache may list Users by it.
const KeyFingerprintField = "spec.keys.fingerprint"

// ErrAmbiguousKey is returned by UserByKey when more than one User holds the key. The
// key is refused rather than resolved to one of them: which user pushed would depend on
// list order, and the other user's apps would be open to the first.
var ErrAmbiguousKey = errors.New("ambiguous key")

// Kube is a gitserver.Directory on bex's Users and Apps.
type Kube struct {
	cfg   Config
	cache client.Reader
}

var _ gitserver.Directory = (*Kube)(nil)

// New returns a directory that reads Users and the Apps of cfg.Namespace from c. It
// writes nothing (a push's writes are the backend's).
//
// New registers the User key index and the User and App informers in c, so it must be
// called before c is started (older client-go refuses indexes on a started informer,
// and a cache started without them would fail every lookup). Start c and wait for it to
// sync afterwards. c must cover cfg.Namespace if it is limited to some namespaces.
func New(ctx context.Context, cfg Config, c cache.Cache) (*Kube, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if c == nil {
		return nil, errors.New("access: a cache is required")
	}
	if err := c.IndexField(ctx, &appv1.User{}, KeyFingerprintField, indexKeyFingerprints); err != nil {
		return nil, fmt.Errorf("index user keys: %w", err)
	}
	// Asking for the App informer now makes it start with the cache, instead of on the
	// first App lookup, which would then block that connection until it synced.
	if _, err := c.GetInformer(ctx, &appv1.App{}); err != nil {
		return nil, fmt.Errorf("app informer: %w", err)
	}
	return &Kube{cfg: cfg.withDefaults(), cache: c}, nil
}

// indexKeyFingerprints is the KeyFingerprintField indexer. A key that does not parse
// is left out, so that one bad key cannot lock its user (or anyone else) out.
func indexKeyFingerprints(obj client.Object) []string {
	u, ok := obj.(*appv1.User)
	if !ok {
		return nil
	}
	var fps []string
	for _, k := range u.Spec.Keys {
		pk, err := backend.PublicKeyOf(k.PublicKey)
		if err != nil {
			continue
		}
		// A user may list the same key under two names; index it once.
		if fp := gossh.FingerprintSHA256(pk); !slices.Contains(fps, fp) {
			fps = append(fps, fp)
		}
	}
	return fps
}

// UserByKey returns the user who holds key, ErrUnknownKey when nobody does, or
// ErrAmbiguousKey (naming the users) when more than one user does. It reads the cache
// only.
func (k *Kube) UserByKey(ctx context.Context, key gossh.PublicKey) (*backend.User, error) {
	fp := gossh.FingerprintSHA256(key)
	var users appv1.UserList
	if err := k.cache.List(ctx, &users, client.MatchingFields{KeyFingerprintField: fp}); err != nil {
		return nil, fmt.Errorf("look up key %s: %w", fp, err)
	}
	// The index is by fingerprint; the decision is on the whole key, so that it rests
	// on the key itself and not on the fingerprint being collision-free.
	want := key.Marshal()
	var found []*backend.User
	for i := range users.Items {
		u := &users.Items[i]
		for _, uk := range u.Spec.Keys {
			pk, err := backend.PublicKeyOf(uk.PublicKey)
			if err != nil || !bytes.Equal(pk.Marshal(), want) {
				continue
			}
			found = append(found, backend.UserOf(u, uk.Name, fp))
			break
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("key %s: %w", fp, gitserver.ErrUnknownKey)
	case 1:
		return found[0], nil
	}
	names := make([]string, len(found))
	for i, u := range found {
		names[i] = u.Name
	}
	slices.Sort(names)
	return nil, fmt.Errorf("%w: %s is held by users %s; remove it from all but one",
		ErrAmbiguousKey, fp, strings.Join(names, ", "))
}

// App returns the app called name from the cache, or ErrAppNotFound.
func (k *Kube) App(ctx context.Context, name string) (*pipeline.App, error) {
	var a appv1.App
	if err := k.cache.Get(ctx, k.key(name), &a); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("app %q: %w", name, pipeline.ErrAppNotFound)
		}
		return nil, fmt.Errorf("get app %q: %w", name, err)
	}
	return toApp(&a), nil
}

func (k *Kube) key(name string) client.ObjectKey {
	return client.ObjectKey{Namespace: k.cfg.Namespace, Name: name}
}

func toApp(a *appv1.App) *pipeline.App {
	return &pipeline.App{
		Name:         a.Name,
		DeployBranch: a.Spec.Git.DeployBranch,
		Members:      slices.Clone(a.Spec.Members),
	}
}

// SyncTimeout bounds how long Start waits for the cache to sync.
const SyncTimeout = 30 * time.Second

// Start is the set-up New asks for, in one call: a cache on restCfg (Users, which
// are cluster-scoped, and the namespaced objects of cfg.Namespace only: on a
// cluster the gitserver may read the Apps of that namespace and no other, and a
// cache of every namespace would never sync), the directory on it, the cache
// started (it runs until ctx ends) and synced. The cache is returned too, for
// other readers of the same objects. It fails with a message saying what to check
// when the API cannot be read.
func Start(ctx context.Context, cfg Config, restCfg *rest.Config, scheme *runtime.Scheme) (*Kube, cache.Cache, error) {
	opts := cache.Options{Scheme: scheme,
		// managedFields are read by no one here; dropped, the cache holds less.
		DefaultTransform: cache.TransformStripManagedFields()}
	if cfg.Namespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{cfg.Namespace: {}}
	}
	c, err := cache.New(restCfg, opts)
	if err != nil {
		return nil, nil, err
	}
	dir, err := New(ctx, cfg, c)
	if err != nil {
		return nil, nil, err
	}
	go func() { _ = c.Start(ctx) }() // a failure to start shows as no sync below
	syncCtx, cancel := context.WithTimeout(ctx, SyncTimeout)
	defer cancel()
	if !c.WaitForCacheSync(syncCtx) {
		return nil, nil, fmt.Errorf("cannot read Users and Apps from the API at %s: is it running, and are bex's CRDs installed?", restCfg.Host)
	}
	return dir, c, nil
}
