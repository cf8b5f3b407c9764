package backend

import (
	"context"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Members is who may use an app besides admins.
func (b *Backend) Members(ctx context.Context, u *User, name string) (*AccessList, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	return &AccessList{App: a.Name, Members: nonNil(a.Spec.Members)}, nil
}

// AddMember lets user push to and manage an app.
func (b *Backend) AddMember(ctx context.Context, u *User, name, user string) error {
	if err := u.mayChange("access:add"); err != nil {
		return err
	}
	// Who may use an app is its members' own decision, not a delegated token's.
	if err := u.unlimited("access:add"); err != nil {
		return err
	}
	if _, err := b.app(ctx, u, name); err != nil {
		return err
	}
	if err := b.cfg.Reader.Get(ctx, client.ObjectKey{Name: user}, &appv1.User{}); err != nil {
		if apierrors.IsNotFound(err) {
			return Errorf(NotFound, "no user %q: an admin creates users with users:add", user)
		}
		return err
	}
	if _, err := b.update(ctx, u, name, func(app *appv1.App) error {
		if slices.Contains(app.Spec.Members, user) {
			return Errorf(Conflict, "%s has access to %s already", user, name)
		}
		app.Spec.Members = append(app.Spec.Members, user)
		return nil
	}); err != nil {
		return err
	}
	b.audit(u, "access:add", name, "member", user)
	return nil
}

// RemoveMember takes away a user's access to an app.
func (b *Backend) RemoveMember(ctx context.Context, u *User, name, user string) error {
	if err := u.mayChange("access:remove"); err != nil {
		return err
	}
	// Who may use an app is its members' own decision, not a delegated token's.
	if err := u.unlimited("access:remove"); err != nil {
		return err
	}
	if _, err := b.update(ctx, u, name, func(app *appv1.App) error {
		if !slices.Contains(app.Spec.Members, user) {
			return Errorf(NotFound, "%s is not a member of %s (access:list %s shows who is)", user, name, name)
		}
		app.Spec.Members = slices.DeleteFunc(app.Spec.Members, func(m string) bool { return m == user })
		return nil
	}); err != nil {
		return err
	}
	b.audit(u, "access:remove", name, "member", user)
	return nil
}
