package sshcmd

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	gossh "golang.org/x/crypto/ssh"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/access"
)

// maxKeyBytes bounds what keys:add reads from stdin: an RSA-16384 key line fits.
const maxKeyBytes = 16 << 10

// KeyInfo is one key in `keys:list --json`.
type KeyInfo struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Fingerprint string `json:"fingerprint"`
	Comment     string `json:"comment"`
	// Current is the key this session authenticated with.
	Current bool `json:"current"`
}

// UserInfo is one user in `users:list --json`.
type UserInfo struct {
	Name          string `json:"name"`
	Role          string `json:"role"`
	CanCreateApps bool   `json:"canCreateApps"`
	Keys          int    `json:"keys"`
}

// keysOf resolves --user: the session's user, or for an admin anyone.
func (s *session) keysOf(user string) (string, error) {
	if user == "" || user == s.user.Name {
		return s.user.Name, nil
	}
	if err := s.requireAdmin("--user"); err != nil {
		return "", err
	}
	return user, nil
}

// userError turns the access package's refusals into one-line user errors.
func userErr(err error) error {
	for _, e := range []error{access.ErrUserExists, access.ErrUserNotFound, access.ErrKeyExists, access.ErrKeyNotFound, access.ErrLastAdmin} {
		if errors.Is(err, e) {
			return fail("%s", strings.TrimPrefix(err.Error(), e.Error()+": "))
		}
	}
	return err
}

func (s *session) keyCommands() []*cobra.Command {
	var addUser string
	add := newCmd(groupAccess, "keys:add NAME [--user USER] < key.pub", "Add an SSH public key, read from stdin", args(1, 1), func(_ *cobra.Command, a []string) error {
		user, err := s.keysOf(addUser)
		if err != nil {
			return err
		}
		text, err := io.ReadAll(io.LimitReader(s.stdin, maxKeyBytes+1))
		if err != nil {
			return err
		}
		if len(text) > maxKeyBytes {
			return fail("stdin holds more than %d bytes: send one public key (the .pub file)", maxKeyBytes)
		}
		if len(strings.TrimSpace(string(text))) == 0 {
			return fail("no key on stdin: ssh bex@HOST keys:add %s < ~/.ssh/id_ed25519.pub", a[0])
		}
		if _, _, err := access.ParseKey(text); err != nil {
			return fail("%v", err)
		}
		if !access.ValidKeyName(a[0]) {
			return fail("%q is not a key name: use letters, digits and - _ . @, starting with a letter or digit, at most 63", a[0])
		}
		fp, err := access.AddKey(s.ctx, s.cfg.Client, user, a[0], text)
		if err != nil {
			return userErr(err)
		}
		s.audit("keys:add", "", "for", user, "keyName", a[0], "added", fp)
		// As ssh-keygen -l prints it, so it can be compared.
		fmt.Fprintf(s.out, "%s\n", fp)
		fmt.Fprintf(s.errOut, "Added key %s to %s.\n", a[0], user)
		return nil
	})
	flags(add).StringVar(&addUser, "user", "", "add the key to this user (admins)")

	var listUser string
	var listJSON bool
	list := newCmd(groupAccess, "keys:list [--user USER]", "List your SSH keys", args(0, 0), func(*cobra.Command, []string) error {
		user, err := s.keysOf(listUser)
		if err != nil {
			return err
		}
		u := &appv1.User{}
		if err := s.cfg.Reader.Get(s.ctx, client.ObjectKey{Name: user}, u); err != nil {
			if isNotFound(err) {
				return fail("no user %q (users:list shows them)", user)
			}
			return err
		}
		out := []KeyInfo{}
		for _, k := range u.Spec.Keys {
			ki := KeyInfo{Name: k.Name}
			if pk, comment, _, _, err := gossh.ParseAuthorizedKey([]byte(k.PublicKey)); err == nil {
				ki.Type, ki.Fingerprint, ki.Comment = pk.Type(), gossh.FingerprintSHA256(pk), comment
				ki.Current = user == s.user.Name && ki.Fingerprint == s.fp
			} else {
				ki.Type = "invalid"
			}
			out = append(out, ki)
		}
		if listJSON {
			return s.json(out)
		}
		w := s.table()
		fmt.Fprintln(w, "NAME\tTYPE\tFINGERPRINT\tCOMMENT")
		for _, k := range out {
			name := k.Name
			if k.Current {
				name += " (this session)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", name, k.Type, k.Fingerprint, k.Comment)
		}
		return w.Flush()
	})
	flags(list).StringVar(&listUser, "user", "", "list this user's keys (admins)")
	jsonFlag(list, &listJSON)
	list.Aliases = []string{"keys"}

	var rmUser string
	remove := newCmd(groupAccess, "keys:remove NAME|FINGERPRINT [--user USER]", "Remove an SSH key; its open sessions close", args(1, 1), func(_ *cobra.Command, a []string) error {
		user, err := s.keysOf(rmUser)
		if err != nil {
			return err
		}
		k, err := access.RemoveKey(s.ctx, s.cfg.Client, user, a[0])
		if err != nil {
			return userErr(err)
		}
		s.audit("keys:remove", "", "for", user, "keyName", k.Name)
		fmt.Fprintf(s.out, "Removed key %s of %s: it is refused from now on, and its open sessions close.\n", k.Name, user)
		return nil
	})
	flags(remove).StringVar(&rmUser, "user", "", "remove a key of this user (admins)")

	var admin, canCreate bool
	uadd := newCmd(groupAccess, "users:add NAME [--admin]", "Create a user (admins); then keys:add NAME --user NAME", args(1, 1), func(_ *cobra.Command, a []string) error {
		if err := s.requireAdmin("users:add"); err != nil {
			return err
		}
		role := appv1.RoleMember
		if admin {
			role = appv1.RoleAdmin
		}
		if err := access.CreateUser(s.ctx, s.cfg.Client, a[0], role, canCreate); err != nil {
			if errors.Is(err, access.ErrUserExists) {
				return userErr(err)
			}
			if !access.ValidUserName(a[0]) {
				return fail("%v", err)
			}
			return err
		}
		s.audit("users:add", "", "name", a[0], "role", role)
		fmt.Fprintf(s.out, "Created %s %s. Give them a key: ssh bex@HOST keys:add NAME --user %s < their_key.pub\n", role, a[0], a[0])
		return nil
	})
	flags(uadd).BoolVar(&admin, "admin", false, "make the user an admin")
	flags(uadd).BoolVar(&canCreate, "can-create-apps", true, "let the user create apps (--can-create-apps=false restricts them to apps they are given)")

	var usersJSON bool
	ulist := newCmd(groupAccess, "users:list", "List the users (admins)", args(0, 0), func(*cobra.Command, []string) error {
		if err := s.requireAdmin("users:list"); err != nil {
			return err
		}
		var users appv1.UserList
		if err := s.cfg.Reader.List(s.ctx, &users); err != nil {
			return err
		}
		out := []UserInfo{}
		for _, u := range users.Items {
			out = append(out, UserInfo{Name: u.Name, Role: string(u.Spec.Role), CanCreateApps: u.Spec.Role == appv1.RoleAdmin || u.Spec.CanCreateApps, Keys: len(u.Spec.Keys)})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		if usersJSON {
			return s.json(out)
		}
		w := s.table()
		fmt.Fprintln(w, "NAME\tROLE\tCREATES APPS\tKEYS")
		for _, u := range out {
			fmt.Fprintf(w, "%s\t%s\t%v\t%d\n", u.Name, u.Role, u.CanCreateApps, u.Keys)
		}
		return w.Flush()
	})
	jsonFlag(ulist, &usersJSON)
	ulist.Aliases = []string{"users"}

	urm := newCmd(groupAccess, "users:remove NAME", "Delete a user and their access (admins)", args(1, 1), func(_ *cobra.Command, a []string) error {
		if err := s.requireAdmin("users:remove"); err != nil {
			return err
		}
		if err := access.DeleteUser(s.ctx, s.cfg.Client, a[0], s.cfg.Namespace); err != nil {
			return userErr(err)
		}
		s.audit("users:remove", "", "name", a[0])
		fmt.Fprintf(s.out, "Removed user %s, their keys and their access to apps.\n", a[0])
		return nil
	})
	return []*cobra.Command{add, list, remove, uadd, ulist, urm}
}
