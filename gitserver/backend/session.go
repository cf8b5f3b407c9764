package backend

import (
	"context"
	"fmt"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Uses is what a long request (an SSH session, an MCP call) has worked on: the
// apps and the databases whose access check it passed. Whoever serves the
// request puts one in its context (WithUses); every operation that reads an app
// or a database for a user records it there; and the server checks the user
// again against those while the request runs (StillMayUse), so that taking
// access away ends what is already open (a `logs -f`, a psql, a push waiting
// for the app's lock, a deploy) and not only what starts next. It is safe for
// concurrent use.
type Uses struct {
	mu   sync.Mutex
	apps []string
	// databases apart: an app and a database may have the same name.
	databases []string
	// ownKeyRemoved: the request removed the key it was signed in with
	// (keys:remove of that key), which it means to; the rechecks let it end
	// on its own rather than cut it off before it has said so.
	ownKeyRemoved bool
}

// OwnKeyRemoved reports whether the request removed the key it was signed in
// with.
func (us *Uses) OwnKeyRemoved() bool {
	us.mu.Lock()
	defer us.mu.Unlock()
	return us.ownKeyRemoved
}

// removedOwnKey records in ctx's Uses, if it carries one, that the request
// removed the key it was signed in with.
func removedOwnKey(ctx context.Context) {
	if us, ok := ctx.Value(usesKey{}).(*Uses); ok {
		us.mu.Lock()
		us.ownKeyRemoved = true
		us.mu.Unlock()
	}
}

type usesKey struct{}

// WithUses returns ctx carrying us: the operations run with it record the apps
// they read there.
func WithUses(ctx context.Context, us *Uses) context.Context {
	return context.WithValue(ctx, usesKey{}, us)
}

// Add records that the request works on app.
func (us *Uses) Add(app string) {
	us.mu.Lock()
	defer us.mu.Unlock()
	if !slices.Contains(us.apps, app) {
		us.apps = append(us.apps, app)
	}
}

// Apps are the apps recorded, in the order first used.
func (us *Uses) Apps() []string {
	us.mu.Lock()
	defer us.mu.Unlock()
	return slices.Clone(us.apps)
}

// AddDatabase records that the request works on the database named name.
func (us *Uses) AddDatabase(name string) {
	us.mu.Lock()
	defer us.mu.Unlock()
	if !slices.Contains(us.databases, name) {
		us.databases = append(us.databases, name)
	}
}

// Databases are the databases recorded, in the order first used.
func (us *Uses) Databases() []string {
	us.mu.Lock()
	defer us.mu.Unlock()
	return slices.Clone(us.databases)
}

// Used records app in ctx's Uses, if it carries one: the operations here call
// it once their access check passed, and so does whatever checks access itself
// (the gitserver's git sessions).
func Used(ctx context.Context, app string) {
	if us, ok := ctx.Value(usesKey{}).(*Uses); ok {
		us.Add(app)
	}
}

// UsedDatabase records the database named name in ctx's Uses, if it carries
// one, as Used does an app.
func UsedDatabase(ctx context.Context, name string) {
	if us, ok := ctx.Value(usesKey{}).(*Uses); ok {
		us.AddDatabase(name)
	}
}

// StillMayUse is the access rule applied again to a request already running:
// nil when now (the request's user as read again, from the same cache as any
// request) may still use app, whose members are members; otherwise a Forbidden
// error whose message is the one line that tells the user why their request
// ends. was is the user as the request started. The rule itself is MayUseApp,
// the one every operation checks (a token's scope, fixed, is now's as it was
// was's).
func StillMayUse(was, now *User, app string, members []string) error {
	if now.MayUseApp(app, members) {
		return nil
	}
	return stillRefused(was, now, app)
}

func stillRefused(was, now *User, what string) error {
	if was.Admin && !now.Admin {
		return Errorf(Forbidden, "%s is no longer an admin, and not a member of %s: this session ends", now.Name, what)
	}
	return Errorf(Forbidden, "your access to %s was removed: this session ends", what)
}

// StillMayUseDatabase is StillMayUse for the database named name, whose
// members are members (its lines say "the database NAME"): the membership
// rule. A token limited to some apps reaches a database through its links
// to them, which the operation that uses it checks as it starts.
func StillMayUseDatabase(was, now *User, name string, members []string) error {
	if now.member(members) {
		return nil
	}
	return stillRefused(was, now, "the database "+name)
}

// CachedDatabase is the database named name as the cache has it now, or nil
// when it is gone: what the rechecks of a request that used it read. A
// database that is gone is skipped, as an app is: nothing is left to use.
func (b *Backend) CachedDatabase(ctx context.Context, name string) (*appv1.Database, error) {
	db := &appv1.Database{}
	if err := b.cfg.Reader.Get(ctx, b.key(name), db); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading database %s: %w", name, err)
	}
	return db, nil
}

// Recheck reads u's User and each of apps again from the cache and returns
// the Forbidden error of StillMayUse for the first app u may no longer use,
// or one saying that u's User is gone; nil when all still hold. An app that
// is gone is skipped: nothing is left to read or change in it. Any other
// error is the cache's, and says nothing about access.
func (b *Backend) Recheck(ctx context.Context, u *User, apps []string) error {
	au := &appv1.User{}
	if err := b.cfg.Reader.Get(ctx, client.ObjectKey{Name: u.Name}, au); err != nil {
		if apierrors.IsNotFound(err) {
			return Errorf(Forbidden, "user %s was removed: this session ends", u.Name)
		}
		return fmt.Errorf("reading user %s: %w", u.Name, err)
	}
	if u.UID != "" && au.UID != u.UID {
		// Removed and made again under the same name: another user.
		return Errorf(Forbidden, "user %s was removed: this session ends", u.Name)
	}
	now := UserOf(au, u.KeyName, u.KeyFingerprint)
	now.Scope = u.Scope // the token's, fixed when it was made
	for _, name := range apps {
		a := &appv1.App{}
		if err := b.cfg.Reader.Get(ctx, b.key(name), a); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("reading app %s: %w", name, err)
		}
		if err := StillMayUse(u, now, name, a.Spec.Members); err != nil {
			return err
		}
	}
	return nil
}
