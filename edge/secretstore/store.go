package secretstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	labelStore    = "app.bex.co/certmagic"
	annotationKey = "app.bex.co/certmagic-key"
	annotationMod = "app.bex.co/certmagic-modified"
	dataKey       = "value"
)

// Config is the store's configuration.
type Config struct {
	// Namespace holds the Secrets and Leases.
	Namespace string
	// LeaseDuration is how long a lock lives without renewal.
	LeaseDuration time.Duration
	// PollInterval is how often a waiting Lock looks again.
	PollInterval time.Duration
	// Identity names this holder in the Leases (default: host name and a random suffix).
	Identity string
}

// Store implements certmagic.Storage.
type Store struct {
	cfg Config
	c   client.Client

	mu      sync.Mutex
	renewal map[string]context.CancelFunc // held locks: name -> stop renewing
}

var _ certmagic.Storage = (*Store)(nil)

// DefaultConfig returns the defaults; Namespace, which has none, is empty. A
// zero LeaseDuration or PollInterval also means its default.
func DefaultConfig() Config { return Config{LeaseDuration: time.Minute, PollInterval: time.Second} }

// New makes a Store. c must read uncached: the replicas write the same objects.
func New(cfg Config, c client.Client) (*Store, error) {
	if cfg.Namespace == "" {
		return nil, errors.New("secretstore: a namespace is required")
	}
	d := DefaultConfig()
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = d.LeaseDuration
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = d.PollInterval
	}
	if cfg.Identity == "" {
		host, _ := os.Hostname()
		suffix := make([]byte, 4)
		_, _ = rand.Read(suffix)
		cfg.Identity = host + "-" + hex.EncodeToString(suffix)
	}
	return &Store{cfg: cfg, c: c, renewal: map[string]context.CancelFunc{}}, nil
}

func objectName(prefix, key string) string {
	sum := sha256.Sum256([]byte(key))
	return prefix + hex.EncodeToString(sum[:20])
}

func (s *Store) secret(ctx context.Context, key string) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	err := s.c.Get(ctx, client.ObjectKey{Namespace: s.cfg.Namespace, Name: objectName("bex-certmagic-", key)}, sec)
	if apierrors.IsNotFound(err) || (err == nil && sec.Annotations[annotationKey] != key) {
		return nil, fs.ErrNotExist
	}
	return sec, err
}

// Store writes value at key.
func (s *Store) Store(ctx context.Context, key string, value []byte) error {
	for attempt := 0; attempt < 5; attempt++ {
		now := time.Now().UTC().Format(time.RFC3339Nano)
		sec, err := s.secret(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
				Name: objectName("bex-certmagic-", key), Namespace: s.cfg.Namespace,
				Labels:      map[string]string{labelStore: "true"},
				Annotations: map[string]string{annotationKey: key, annotationMod: now},
			}, Data: map[string][]byte{dataKey: value}}
			err = s.c.Create(ctx, sec)
		} else if err == nil {
			sec.Annotations[annotationMod] = now
			sec.Data = map[string][]byte{dataKey: value}
			err = s.c.Update(ctx, sec)
		}
		if err == nil || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) {
			return err
		}
	}
	return fmt.Errorf("secretstore: %s kept changing while it was stored", key)
}

// Load reads key; a missing key is fs.ErrNotExist.
func (s *Store) Load(ctx context.Context, key string) ([]byte, error) {
	sec, err := s.secret(ctx, key)
	if err != nil {
		return nil, err
	}
	return sec.Data[dataKey], nil
}

// all lists every stored key with its Secret.
func (s *Store) all(ctx context.Context) (map[string]*corev1.Secret, error) {
	var list corev1.SecretList
	if err := s.c.List(ctx, &list, client.InNamespace(s.cfg.Namespace), client.MatchingLabels{labelStore: "true"}); err != nil {
		return nil, err
	}
	out := make(map[string]*corev1.Secret, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Annotations[annotationKey]] = &list.Items[i]
	}
	return out, nil
}

// Delete removes key, and every key below it when it is a directory. A key that
// does not exist is not an error: it is gone either way.
func (s *Store) Delete(ctx context.Context, key string) error {
	all, err := s.all(ctx)
	if err != nil {
		return err
	}
	for k, sec := range all {
		if k == key || strings.HasPrefix(k, key+"/") {
			if err := s.c.Delete(ctx, sec); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// Exists reports whether key is stored or is a directory of stored keys.
func (s *Store) Exists(ctx context.Context, key string) bool {
	_, err := s.Stat(ctx, key)
	return err == nil
}

// List returns the keys below path: all of them when recursive, else the
// immediate children (files and directories).
func (s *Store) List(ctx context.Context, path string, recursive bool) ([]string, error) {
	all, err := s.all(ctx)
	if err != nil {
		return nil, err
	}
	prefix := strings.TrimSuffix(path, "/") + "/"
	if path == "" {
		prefix = ""
	}
	seen := map[string]bool{}
	for k := range all {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok || rest == "" {
			continue
		}
		if !recursive {
			if i := strings.IndexByte(rest, '/'); i >= 0 {
				rest = rest[:i]
			}
			seen[prefix+rest] = true
			continue
		}
		seen[k] = true
	}
	if len(seen) == 0 {
		return nil, fs.ErrNotExist
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

// Stat describes key: a stored value, or a directory of them.
func (s *Store) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	if sec, err := s.secret(ctx, key); err == nil {
		mod, _ := time.Parse(time.RFC3339Nano, sec.Annotations[annotationMod])
		return certmagic.KeyInfo{Key: key, Modified: mod, Size: int64(len(sec.Data[dataKey])), IsTerminal: true}, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return certmagic.KeyInfo{}, err
	}
	if _, err := s.List(ctx, key, false); err == nil {
		return certmagic.KeyInfo{Key: key, IsTerminal: false}, nil
	}
	return certmagic.KeyInfo{}, fs.ErrNotExist
}

// Lock takes the lock called name, waiting while another holder keeps it alive,
// and renews it until Unlock.
func (s *Store) Lock(ctx context.Context, name string) error {
	leaseName := objectName("bex-certmagic-lock-", name)
	for {
		ok, err := s.tryLock(ctx, leaseName)
		if err != nil {
			return err
		}
		if ok {
			renewCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
			s.mu.Lock()
			s.renewal[name] = stop
			s.mu.Unlock()
			go s.renew(renewCtx, leaseName)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.cfg.PollInterval):
		}
	}
}

func (s *Store) tryLock(ctx context.Context, leaseName string) (bool, error) {
	now := metav1.NewMicroTime(time.Now())
	seconds := int32(s.cfg.LeaseDuration / time.Second)
	if seconds < 1 {
		seconds = 1
	}
	lease := &coordinationv1.Lease{}
	err := s.c.Get(ctx, client.ObjectKey{Namespace: s.cfg.Namespace, Name: leaseName}, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: leaseName, Namespace: s.cfg.Namespace, Labels: map[string]string{labelStore: "true"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &s.cfg.Identity, LeaseDurationSeconds: &seconds, AcquireTime: &now, RenewTime: &now},
		}
		err = s.c.Create(ctx, lease)
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	if !expired(lease, time.Now()) {
		return false, nil
	}
	// Take over an expired lock; the update's resourceVersion makes only one of
	// several waiters win.
	lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds = &s.cfg.Identity, &seconds
	lease.Spec.AcquireTime, lease.Spec.RenewTime = &now, &now
	err = s.c.Update(ctx, lease)
	if apierrors.IsConflict(err) {
		return false, nil
	}
	return err == nil, err
}

func expired(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true
	}
	return now.After(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second))
}

func (s *Store) renew(ctx context.Context, leaseName string) {
	t := time.NewTicker(s.cfg.LeaseDuration / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lease := &coordinationv1.Lease{}
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.cfg.Namespace, Name: leaseName}, lease); err != nil {
			continue
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != s.cfg.Identity {
			return // lost it (expired and taken over)
		}
		now := metav1.NewMicroTime(time.Now())
		lease.Spec.RenewTime = &now
		_ = s.c.Update(ctx, lease)
	}
}

// Unlock releases the lock called name if this store holds it.
func (s *Store) Unlock(ctx context.Context, name string) error {
	s.mu.Lock()
	stop := s.renewal[name]
	delete(s.renewal, name)
	s.mu.Unlock()
	if stop == nil {
		return fmt.Errorf("secretstore: lock %q is not held here", name)
	}
	stop()
	lease := &coordinationv1.Lease{}
	leaseName := objectName("bex-certmagic-lock-", name)
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.cfg.Namespace, Name: leaseName}, lease); err != nil {
		return client.IgnoreNotFound(err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != s.cfg.Identity {
		return nil // expired and taken over: nothing of ours to release
	}
	return client.IgnoreNotFound(s.c.Delete(ctx, lease, client.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion}))
}
