package backend

import (
	"context"
	"errors"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Who may use a database besides admins (postgres:access:*, redis:access:*):
// its spec.members, with the rules of an app's (access:*). Whoever may use it
// (an admin, a member) may add an existing user and remove any member;
// anyone else is told what an unknown name would tell, and so is one who
// names a database of the other engine, so that these commands never say
// that a name is taken by a database of the other kind.

// DatabaseAccess is who may use a database besides admins, as
// postgres:access:list and redis:access:list show it.
type DatabaseAccess struct {
	Database string   `json:"database"`
	Engine   string   `json:"engine" jsonschema:"postgres or redis"`
	Members  []string `json:"members"`
}

// memberDatabase reads a database of engine that u may use; one of the other
// engine is answered as one that does not exist.
func (b *Backend) memberDatabase(ctx context.Context, u *User, engine appv1.DatabaseEngine, name string) (*appv1.Database, error) {
	if err := checkEngine(engine); err != nil {
		return nil, err
	}
	db, err := b.database(ctx, u, "", name)
	if KindOf(err) == NotFound || (err == nil && db.Spec.Engine != engine) {
		return nil, noSuchDatabase(engine, name)
	}
	return db, err
}

// DatabaseMembers is who may use a database of engine besides admins.
func (b *Backend) DatabaseMembers(ctx context.Context, u *User, engine appv1.DatabaseEngine, name string) (*DatabaseAccess, error) {
	db, err := b.memberDatabase(ctx, u, engine, name)
	if err != nil {
		return nil, err
	}
	return &DatabaseAccess{Database: db.Name, Engine: string(db.Spec.Engine), Members: nonNil(db.Spec.Members)}, nil
}

// AddDatabaseMember lets user see, link and use a database of engine. The
// user must exist; one who is a member already is refused with a line.
func (b *Backend) AddDatabaseMember(ctx context.Context, u *User, engine appv1.DatabaseEngine, name, user string) error {
	// Who may use a database reaches past the apps of a limited token.
	if err := u.mayChange(dbOp(engine, "access:add")); err != nil {
		return err
	}
	if err := u.unlimited(dbOp(engine, "access:add")); err != nil {
		return err
	}
	if _, err := b.memberDatabase(ctx, u, engine, name); err != nil {
		return err
	}
	noUser := Errorf(NotFound, "no user %q: an admin creates users with users:add", user)
	if len(validation.IsDNS1123Subdomain(user)) > 0 {
		return noUser // no User can have that name
	}
	if err := b.cfg.Reader.Get(ctx, client.ObjectKey{Name: user}, &appv1.User{}); err != nil {
		if apierrors.IsNotFound(err) {
			return noUser
		}
		return fmt.Errorf("reading user %s: %w", user, err)
	}
	if err := b.updateDatabase(ctx, u, engine, name, func(db *appv1.Database) error {
		if slices.Contains(db.Spec.Members, user) {
			return Errorf(Conflict, "%s has access to %s already", user, name)
		}
		db.Spec.Members = append(db.Spec.Members, user)
		return nil
	}); err != nil {
		return err
	}
	b.auditDatabase(u, string(engine)+":access:add", name, "member", user)
	return nil
}

// RemoveDatabaseMember takes away a user's access to a database of engine
// (its apps linked already keep their link: unlinking is the apps' own
// change).
func (b *Backend) RemoveDatabaseMember(ctx context.Context, u *User, engine appv1.DatabaseEngine, name, user string) error {
	if err := u.mayChange(dbOp(engine, "access:remove")); err != nil {
		return err
	}
	if err := u.unlimited(dbOp(engine, "access:remove")); err != nil {
		return err
	}
	if _, err := b.memberDatabase(ctx, u, engine, name); err != nil {
		return err
	}
	if err := b.updateDatabase(ctx, u, engine, name, func(db *appv1.Database) error {
		if !slices.Contains(db.Spec.Members, user) {
			return Errorf(NotFound, "%s is not a member of %s (%s:access:list %s shows who is)", user, name, engine, name)
		}
		db.Spec.Members = slices.DeleteFunc(db.Spec.Members, func(m string) bool { return m == user })
		return nil
	}); err != nil {
		return err
	}
	b.auditDatabase(u, string(engine)+":access:remove", name, "member", user)
	return nil
}

// updateDatabase applies change to the database as the API server has it,
// again on a conflict with another writer (the deployer writes its status,
// another member its members), the access rule checked on each read; then it
// waits until the cache has the change, so that the next command sees it.
func (b *Backend) updateDatabase(ctx context.Context, u *User, engine appv1.DatabaseEngine, name string, change func(*appv1.Database) error) error {
	var updated *appv1.Database
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		db := &appv1.Database{}
		if err := b.cfg.Client.Get(ctx, b.key(name), db); err != nil {
			if apierrors.IsNotFound(err) {
				return noSuchDatabase(engine, name)
			}
			return err
		}
		if !u.MayUse(db.Spec.Members) || db.Spec.Engine != engine {
			return noSuchDatabase(engine, name)
		}
		if err := change(db); err != nil {
			return err
		}
		if err := b.cfg.Client.Update(ctx, db); err != nil {
			return err
		}
		updated = db
		return nil
	})
	var e *Error
	switch {
	case errors.As(err, &e):
		return err
	case apierrors.IsInvalid(err):
		return Errorf(Invalid, "the API refused the change of database %s: %s", name, apierrors.ReasonForError(err))
	case apierrors.IsConflict(err):
		return Errorf(Conflict, "%s changed too often meanwhile: try again", name)
	case err != nil:
		return fmt.Errorf("updating database %s: %w", name, err)
	}
	return b.waitDatabaseCached(ctx, name, func(c *appv1.Database) bool {
		if c == nil || c.UID != updated.UID {
			return false
		}
		if n, err := resourceversion.CompareResourceVersion(c.ResourceVersion, updated.ResourceVersion); err == nil {
			return n >= 0
		}
		return c.ResourceVersion == updated.ResourceVersion || c.Generation > updated.Generation
	})
}
