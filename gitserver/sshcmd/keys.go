package sshcmd

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (s *session) keyCommands() []*cobra.Command {
	var addUser string
	add := newCmd(groupAccess, "keys:add NAME [--user USER] < key.pub", "Add an SSH public key, read from stdin", args(1, 1), func(_ *cobra.Command, a []string) error {
		fp, owner, err := s.b.AddKey(s.ctx, s.user, addUser, a[0], s.stdin)
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "%s\n", fp)
		fmt.Fprintf(s.errOut, "Added key %s to %s.\n", a[0], owner)
		return nil
	})
	flags(add).StringVar(&addUser, "user", "", "add the key to this user (admins)")

	var listUser string
	var listJSON bool
	list := newCmd(groupAccess, "keys:list [--user USER]", "List your SSH keys", args(0, 0), func(*cobra.Command, []string) error {
		out, err := s.b.Keys(s.ctx, s.user, listUser)
		if err != nil {
			return err
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
	remove := newCmd(groupAccess, "keys:remove NAME|FINGERPRINT [--user USER]", "Remove an SSH key; its open sessions close and the tokens made with it are revoked", args(1, 1), func(_ *cobra.Command, a []string) error {
		name, owner, revoked, err := s.b.RemoveKey(s.ctx, s.user, rmUser, a[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Removed key %s of %s: it is refused from now on, its open sessions close, and the tokens made with it (%d) are revoked.\n", name, owner, revoked)
		return nil
	})
	flags(remove).StringVar(&rmUser, "user", "", "remove a key of this user (admins)")

	var admin, canCreate bool
	uadd := newCmd(groupAccess, "users:add NAME [--admin]", "Create a user (admins); then keys:add NAME --user NAME", args(1, 1), func(_ *cobra.Command, a []string) error {
		role, err := s.b.AddUser(s.ctx, s.user, a[0], admin, canCreate)
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Created %s %s. Give them a key: ssh bex@HOST keys:add NAME --user %s < their_key.pub\n", role, a[0], a[0])
		return nil
	})
	flags(uadd).BoolVar(&admin, "admin", false, "make the user an admin")
	flags(uadd).BoolVar(&canCreate, "can-create-apps", true, "let the user create apps (--can-create-apps=false restricts them to apps they are given)")

	var usersJSON bool
	ulist := newCmd(groupAccess, "users:list", "List the users (admins)", args(0, 0), func(*cobra.Command, []string) error {
		out, err := s.b.Users(s.ctx, s.user)
		if err != nil {
			return err
		}
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
		if err := s.b.RemoveUser(s.ctx, s.user, a[0]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Removed user %s, their keys and their access to apps.\n", a[0])
		return nil
	})
	return []*cobra.Command{add, list, remove, uadd, ulist, urm}
}
