package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// usersAddCmd creates a user through the API, on the server itself: the way to the
// first admin, before anyone can log in over SSH to run users:add.
type usersAddCmd struct {
	out io.Writer
	apiFlags
	admin, canCreateApps bool
	keyFile, keyName     string
	name                 string
}

func (c *usersAddCmd) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "add NAME [--admin] [--key FILE]",
		Short: "Create a user, or give an existing one a key (--admin: make them an admin)",
		Long: "users add writes a User through the API, for the first admin of a server:\n" +
			"  bex users add ana --admin --key ~/.ssh/id_ed25519.pub\n" +
			"Later users are easier added over SSH: ssh bex@HOST users:add NAME.",
		Args: cobra.ExactArgs(1),
		PreRunE: func(cmd *cobra.Command, args []string) error {
			c.name = args[0]
			return bindEnv(cmd)
		},
	}
	f := cmd.Flags()
	c.apiFlags.bind(f, "bex's state directory (for its kubeconfig)")
	f.BoolVar(&c.admin, "admin", false, "make the user an admin")
	f.BoolVar(&c.canCreateApps, "can-create-apps", true, "let a member create apps")
	f.StringVar(&c.keyFile, "key", "", "an OpenSSH public key file (.pub) to give the user")
	f.StringVar(&c.keyName, "key-name", "key", "the key's name")
	return cmd
}

func (c *usersAddCmd) run(ctx context.Context) error {
	kc, err := c.client()
	if err != nil {
		return err
	}
	var key []byte
	if c.keyFile != "" {
		if key, err = os.ReadFile(c.keyFile); err != nil {
			return fmt.Errorf("--key: %w", err)
		}
	}
	if c.admin && key != nil {
		// The same path as --admin-keys at start: idempotent, promotes an existing
		// user, names the key after its comment.
		changed, err := backend.EnsureAdmin(ctx, kc, c.name, key)
		if err != nil {
			return err
		}
		if !changed {
			fmt.Fprintf(c.out, "%s is an admin with that key already.\n", c.name)
			return nil
		}
		fmt.Fprintf(c.out, "%s is an admin, with the key of %s.\n", c.name, c.keyFile)
		return nil
	}
	role := appv1.RoleMember
	if c.admin {
		role = appv1.RoleAdmin
	}
	created := true
	if err := backend.CreateUser(ctx, kc, c.name, role, c.canCreateApps); err != nil {
		if !errors.Is(err, backend.ErrConflict) || key == nil {
			return err
		}
		created = false
	}
	if created {
		fmt.Fprintf(c.out, "Created %s %s.\n", role, c.name)
	}
	if key != nil {
		fp, err := backend.AddKey(ctx, kc, c.name, c.keyName, key)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.out, "Added key %s (%s) to %s.\n", c.keyName, fp, c.name)
	}
	return nil
}

func (c *usersAddCmd) close() error { return nil }

func (a *apiFlags) client() (client.Client, error) {
	cfg, s, err := a.connect()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: s})
}

// usersListCmd lists the users, as users:list does over SSH.
type usersListCmd struct {
	out io.Writer
	apiFlags
	json bool
}

func (c *usersListCmd) command() *cobra.Command {
	cmd := &cobra.Command{Use: "list", Short: "List the users", Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error { return bindEnv(cmd) }}
	c.apiFlags.bind(cmd.Flags(), "bex's state directory (for its kubeconfig)")
	cmd.Flags().BoolVar(&c.json, "json", false, "print JSON (the schema of users:list --json)")
	return cmd
}

func (c *usersListCmd) run(ctx context.Context) error {
	kc, err := c.client()
	if err != nil {
		return err
	}
	out, err := backend.ListUsers(ctx, kc)
	if err != nil {
		return err
	}
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tROLE\tCREATES APPS\tKEYS")
	for _, u := range out {
		fmt.Fprintf(w, "%s\t%s\t%v\t%d\n", u.Name, u.Role, u.CanCreateApps, u.Keys)
	}
	return w.Flush()
}

func (c *usersListCmd) close() error { return nil }

// ensureAdminKeys makes "admin" an admin holding each key of files (one or more
// authorized_keys lines each): `bex gitserver --admin-keys` / BEX_ADMIN_KEYS.
func ensureAdminKeys(ctx context.Context, c client.Client, files []string) error {
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("admin keys: %w", err)
		}
		if _, err := backend.EnsureAdminKeys(ctx, c, "admin", data); err != nil {
			return fmt.Errorf("admin keys in %s: %w", f, err)
		}
	}
	return nil
}
