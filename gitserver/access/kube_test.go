package access_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// env is one test's directory on the shared control plane, with its own cache and its
// own namespace for Apps.
type env struct {
	cp  *testenv.ControlPlane
	dir *access.Kube
	ns  string
	id  int64
}

// envSeq makes names unique within the test binary, whose control plane outlives one
// test and, with -count, one run of it.
var envSeq atomic.Int64

// name returns base made unique to this test, for cluster-scoped objects (Users).
func (e *env) name(base string) string { return fmt.Sprintf("%s-%d", base, e.id) }

// newEnv builds a cache on cfg (the control plane's when nil), sets up the directory
// on it for a fresh namespace named after prefix, starts the cache and waits for it to
// sync, in the order a caller must follow.
func newEnv(t *testing.T, prefix string, cfg *rest.Config) *env {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	id := envSeq.Add(1)
	ns := fmt.Sprintf("%s-%d", prefix, id)
	if cfg == nil {
		cfg = cp.Config
	}
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(cfg, cache.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := access.New(ctx, access.Config{Namespace: ns}, c)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Start(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("cache: %v", err)
		}
	})
	syncCtx, cancelSync := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSync()
	if !c.WaitForCacheSync(syncCtx) {
		t.Fatal("cache did not sync")
	}
	return &env{cp: cp, dir: dir, ns: ns, id: id}
}

// newKey returns a fresh ed25519 public key and its authorized_keys line.
func newKey(t *testing.T) (gossh.PublicKey, string) {
	t.Helper()
	k := testenv.NewSSHKey(t)
	return k.Signer.PublicKey(), k.AuthorizedKey
}

func (e *env) createUser(t *testing.T, name string, spec appv1.UserSpec) {
	t.Helper()
	u := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	if err := e.cp.Client.Create(context.Background(), u); err != nil {
		t.Fatalf("create user %s: %v", name, err)
	}
}

// updateUser changes a User through the API, as an admin would with kubectl.
func (e *env) updateUser(t *testing.T, name string, change func(*appv1.UserSpec)) {
	t.Helper()
	var u appv1.User
	if err := e.cp.Client.Get(context.Background(), client.ObjectKey{Name: name}, &u); err != nil {
		t.Fatal(err)
	}
	change(&u.Spec)
	if err := e.cp.Client.Update(context.Background(), &u); err != nil {
		t.Fatalf("update user %s: %v", name, err)
	}
}

// userIs checks what UserByKey returns for key; the UID wanted is the User
// object's as the API server has it now (tokens are bound to it).
func (e *env) userIs(key gossh.PublicKey, want backend.User) func() error {
	want.KeyFingerprint = gossh.FingerprintSHA256(key)
	return func() error {
		obj := &appv1.User{}
		if err := e.cp.Client.Get(context.Background(), client.ObjectKey{Name: want.Name}, obj); err != nil {
			return err
		}
		want.UID = obj.UID
		u, err := e.dir.UserByKey(context.Background(), key)
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(*u, want) {
			return fmt.Errorf("got %+v, want %+v", *u, want)
		}
		return nil
	}
}

// unknown checks that UserByKey refuses key as unknown.
func (e *env) unknown(key gossh.PublicKey) func() error {
	return func() error {
		u, err := e.dir.UserByKey(context.Background(), key)
		if !errors.Is(err, gitserver.ErrUnknownKey) {
			return fmt.Errorf("got user %+v, error %v; want ErrUnknownKey", u, err)
		}
		return nil
	}
}

func TestUserByKeyKnown(t *testing.T) {
	e := newEnv(t, "known", nil)
	laptop, laptopLine := newKey(t)
	ci, ciLine := newKey(t)
	bobKey, bobLine := newKey(t)
	e.createUser(t, e.name("known-alice"), appv1.UserSpec{Role: appv1.RoleAdmin, Keys: []appv1.SSHKey{
		{Name: "laptop", PublicKey: laptopLine}, {Name: "ci", PublicKey: ciLine},
	}})
	e.createUser(t, e.name("known-bob"), appv1.UserSpec{Role: appv1.RoleMember, CanCreateApps: true, Keys: []appv1.SSHKey{
		{Name: "desk", PublicKey: bobLine},
	}})

	testenv.Eventually(t, 10*time.Second, "alice's ci key", e.userIs(ci, backend.User{Name: e.name("known-alice"), Admin: true, CanCreateApps: true, KeyName: "ci"}))
	testenv.Eventually(t, 10*time.Second, "alice's laptop key", e.userIs(laptop, backend.User{Name: e.name("known-alice"), Admin: true, CanCreateApps: true, KeyName: "laptop"}))
	testenv.Eventually(t, 10*time.Second, "bob's key", e.userIs(bobKey, backend.User{Name: e.name("known-bob"), CanCreateApps: true, KeyName: "desk"}))
}

func TestUserByKeyUnknown(t *testing.T) {
	e := newEnv(t, "unknown", nil)
	known, knownLine := newKey(t)
	e.createUser(t, e.name("unknown-carl"), appv1.UserSpec{Role: appv1.RoleMember, Keys: []appv1.SSHKey{{Name: "k", PublicKey: knownLine}}})
	testenv.Eventually(t, 10*time.Second, "carl's key", e.userIs(known, backend.User{Name: e.name("unknown-carl"), KeyName: "k"}))

	stranger, _ := newKey(t)
	if err := e.unknown(stranger)(); err != nil {
		t.Fatal(err)
	}
}

func TestUserByKeyFollowsUpdates(t *testing.T) {
	e := newEnv(t, "updates", nil)
	old, oldLine := newKey(t)
	added, addedLine := newKey(t)
	e.createUser(t, e.name("updates-dana"), appv1.UserSpec{Role: appv1.RoleMember, Keys: []appv1.SSHKey{{Name: "old", PublicKey: oldLine}}})
	testenv.Eventually(t, 10*time.Second, "the first key", e.userIs(old, backend.User{Name: e.name("updates-dana"), KeyName: "old"}))
	if err := e.unknown(added)(); err != nil {
		t.Fatalf("before it is added: %v", err)
	}

	// Added through the API: works on a later call, same directory, no restart.
	e.updateUser(t, e.name("updates-dana"), func(s *appv1.UserSpec) {
		s.Keys = append(s.Keys, appv1.SSHKey{Name: "new", PublicKey: addedLine})
	})
	testenv.Eventually(t, 10*time.Second, "the added key", e.userIs(added, backend.User{Name: e.name("updates-dana"), KeyName: "new"}))

	// Removed: stops working, and the other key keeps working.
	e.updateUser(t, e.name("updates-dana"), func(s *appv1.UserSpec) {
		s.Keys = slices.DeleteFunc(s.Keys, func(k appv1.SSHKey) bool { return k.Name == "old" })
	})
	testenv.Eventually(t, 10*time.Second, "the removed key refused", e.unknown(old))
	if err := e.userIs(added, backend.User{Name: e.name("updates-dana"), KeyName: "new"})(); err != nil {
		t.Fatalf("the remaining key: %v", err)
	}

	// Deleting the user drops its keys too.
	if err := e.cp.Client.Delete(context.Background(), &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: e.name("updates-dana")}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the deleted user's key refused", e.unknown(added))
}

func TestUserByKeyHeldByTwoUsers(t *testing.T) {
	e := newEnv(t, "shared", nil)
	shared, sharedLine := newKey(t)
	own, ownLine := newKey(t)
	e.createUser(t, e.name("shared-ann"), appv1.UserSpec{Role: appv1.RoleAdmin, Keys: []appv1.SSHKey{{Name: "a", PublicKey: sharedLine}}})
	e.createUser(t, e.name("shared-ben"), appv1.UserSpec{Role: appv1.RoleMember, Keys: []appv1.SSHKey{
		{Name: "b", PublicKey: sharedLine}, {Name: "own", PublicKey: ownLine},
	}})

	testenv.Eventually(t, 10*time.Second, "the shared key refused", func() error {
		u, err := e.dir.UserByKey(context.Background(), shared)
		if !errors.Is(err, access.ErrAmbiguousKey) {
			return fmt.Errorf("got user %+v, error %v; want ErrAmbiguousKey", u, err)
		}
		if u != nil {
			return fmt.Errorf("got user %+v with the error", u)
		}
		for _, name := range []string{e.name("shared-ann"), e.name("shared-ben")} {
			if !strings.Contains(err.Error(), name) {
				return fmt.Errorf("error %q does not name %s", err, name)
			}
		}
		if errors.Is(err, gitserver.ErrUnknownKey) {
			return fmt.Errorf("error %q claims the key is unknown", err)
		}
		return nil
	})
	// A key only one of them holds is not affected.
	if err := e.userIs(own, backend.User{Name: e.name("shared-ben"), KeyName: "own"})(); err != nil {
		t.Fatal(err)
	}
}

func TestUserByKeySkipsMalformedKey(t *testing.T) {
	e := newEnv(t, "malformed", nil)
	good, goodLine := newKey(t)
	// Both pass the CRD's pattern but do not parse: a truncated ed25519 key, and an
	// ed25519 header whose key bytes are garbage.
	e.createUser(t, e.name("malformed-eve"), appv1.UserSpec{Role: appv1.RoleMember, Keys: []appv1.SSHKey{
		{Name: "truncated", PublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB"},
		{Name: "garbage", PublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJleA== eve"},
		{Name: "good", PublicKey: goodLine},
	}})
	testenv.Eventually(t, 10*time.Second, "the good key", e.userIs(good, backend.User{Name: e.name("malformed-eve"), KeyName: "good"}))
}

func TestApp(t *testing.T) {
	e := newEnv(t, "apps", nil)
	ctx := context.Background()
	a := &appv1.App{
		ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: e.ns},
		Spec:       appv1.AppSpec{Git: appv1.GitSpec{DeployBranch: "prod"}, Members: []string{"ann", "ben"}},
	}
	if err := e.cp.Client.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	want := pipeline.App{Name: "shop", DeployBranch: "prod", Members: []string{"ann", "ben"}}
	testenv.Eventually(t, 10*time.Second, "the app", func() error {
		got, err := e.dir.App(ctx, "shop")
		if err != nil {
			return err
		}
		if got.Name != want.Name || got.DeployBranch != want.DeployBranch || !slices.Equal(got.Members, want.Members) {
			return fmt.Errorf("got %+v, want %+v", *got, want)
		}
		return nil
	})

	if got, err := e.dir.App(ctx, "no-such-app"); !errors.Is(err, pipeline.ErrAppNotFound) {
		t.Fatalf("missing app: got %+v, %v; want ErrAppNotFound", got, err)
	}
	// An App in another namespace is not this directory's.
	other := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: e.name("elsewhere"), Namespace: "default"}}
	if err := e.cp.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.cp.Client.Delete(context.Background(), other) })
	if got, err := e.dir.App(ctx, other.Name); !errors.Is(err, pipeline.ErrAppNotFound) {
		t.Fatalf("app of another namespace: got %+v, %v; want ErrAppNotFound", got, err)
	}
}

// countingTransport counts the requests that are not watches.
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Query().Get("watch") != "true" {
		c.n.Add(1)
	}
	return c.next.RoundTrip(r)
}

// TestLookupsMakeNoAPICalls proves that the reads on the SSH path are served by the
// cache: once it has synced, key and app lookups send nothing to the API server.
func TestLookupsMakeNoAPICalls(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	var calls atomic.Int64
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, n: &calls} })
	e := newEnv(t, "nocalls", cfg)
	ctx := context.Background()

	key, line := newKey(t)
	e.createUser(t, e.name("nocalls-fay"), appv1.UserSpec{Role: appv1.RoleMember, Keys: []appv1.SSHKey{{Name: "k", PublicKey: line}}})
	if err := e.cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "quiet", Namespace: e.ns}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "fay's key", e.userIs(key, backend.User{Name: e.name("nocalls-fay"), KeyName: "k"}))
	testenv.Eventually(t, 10*time.Second, "the app", func() error { _, err := e.dir.App(ctx, "quiet"); return err })

	before := calls.Load()
	stranger, _ := newKey(t)
	for range 100 {
		if _, err := e.dir.UserByKey(ctx, key); err != nil {
			t.Fatal(err)
		}
		if _, err := e.dir.UserByKey(ctx, stranger); !errors.Is(err, gitserver.ErrUnknownKey) {
			t.Fatal(err)
		}
		if _, err := e.dir.App(ctx, "quiet"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.dir.App(ctx, "absent"); !errors.Is(err, pipeline.ErrAppNotFound) {
			t.Fatal(err)
		}
	}
	if n := calls.Load() - before; n != 0 {
		t.Fatalf("400 lookups made %d API calls", n)
	}
}

func TestNewNeedsValidConfig(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	c, err := cache.New(cp.Config, cache.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := access.New(context.Background(), access.Config{Namespace: "Bad_Namespace"}, c); err == nil {
		t.Fatal("New accepted an invalid namespace")
	}
}
