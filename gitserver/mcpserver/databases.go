package mcpserver

import (
	"context"
	"fmt"
	"strings"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// DatabaseList is databases' result.
type DatabaseList struct {
	Databases []backend.DatabaseInfo `json:"databases"`
	// Next is the cursor of the next page ("": none).
	Next string `json:"next,omitempty" jsonschema:"more remain: pass it as after for the next page; absent when this is the last"`
}

// CreateDatabaseArgs are create_database's arguments.
type CreateDatabaseArgs struct {
	Engine  string `json:"engine" jsonschema:"postgres or redis"`
	Name    string `json:"name" jsonschema:"the database's name: 1 to 40 lower-case letters, digits and '-', starting and ending with a letter or digit"`
	Version string `json:"version,omitempty" jsonschema:"the engine's major version, e.g. 16 (default: the platform's)"`
	Size    string `json:"size,omitempty" jsonschema:"the disk of its data, 16Mi to 16Ti (default 1Gi)"`
	Change
}

// DatabaseCreated is create_database's result.
type DatabaseCreated struct {
	backend.DatabaseInfo
	Planned
}

// LinkDatabaseArgs are link_database's arguments.
type LinkDatabaseArgs struct {
	Name string `json:"name" jsonschema:"the database's name"`
	App  string `json:"app" jsonschema:"the app's name"`
	As   string `json:"as,omitempty" jsonschema:"the config var's name; default DATABASE_URL for Postgres, REDIS_URL for Redis"`
	Change
}

// UnlinkDatabaseArgs are unlink_database's arguments.
type UnlinkDatabaseArgs struct {
	Name string `json:"name" jsonschema:"the database's name"`
	App  string `json:"app" jsonschema:"the app's name"`
	Change
}

// DatabaseLinked is link_database's and unlink_database's result.
type DatabaseLinked struct {
	Database string   `json:"database"`
	App      string   `json:"app"`
	Vars     []string `json:"vars" jsonschema:"the config vars set (link) or removed (unlink)"`
	Release  int64    `json:"release" jsonschema:"the app's new release (0: nothing released; the change kept for its first deploy, or nothing to change)"`
	URL      string   `json:"url,omitempty"`
	Planned
}

func requiredName(name string) error {
	if name == "" {
		return backend.Errorf(backend.Invalid, "the argument name is required")
	}
	return nil
}

// databaseTools are the managed databases (their clients, dumps and restores
// are terminals and byte streams: ssh only).
func (s *Server) databaseTools() {
	b := s.cfg.Backend
	addTool(s, "databases", reads, "List the databases (Postgres, Redis) you may use: engine, version, status, address, size, the apps linked to them. Never their passwords.",
		func(ctx context.Context, u *backend.User, in ListArgs) (DatabaseList, string, error) {
			all, err := b.Databases(ctx, u, "")
			if err != nil {
				return DatabaseList{}, "", err
			}
			if len(all) == 0 {
				return DatabaseList{Databases: all}, "You may use no databases.", nil
			}
			dbs, next, err := pageByName(all, func(d backend.DatabaseInfo) string { return d.Name }, in)
			if err != nil {
				return DatabaseList{}, "", err
			}
			parts := make([]string, len(dbs))
			for i, d := range dbs {
				parts[i] = fmt.Sprintf("%s (%s, %s)", d.Name, d.Engine, d.Status)
			}
			return DatabaseList{Databases: dbs, Next: next}, fmt.Sprintf("%d databases: %s.", len(dbs), strings.Join(parts, ", ")) + cutNote(next, "after"), nil
		})

	addTool(s, "create_database", changes, "Create a managed database, Postgres or Redis; you become its member. It is Pending, then Running once its server accepts connections (see databases); link_database then gives an app its URL.",
		func(ctx context.Context, u *backend.User, in CreateDatabaseArgs) (DatabaseCreated, string, error) {
			if err := requiredName(in.Name); err != nil {
				return DatabaseCreated{}, "", err
			}
			d, err := b.CreateDatabase(ctx, u, backend.DatabaseRequest{Engine: appv1.DatabaseEngine(in.Engine), Name: in.Name, Version: in.Version, Size: in.Size})
			if err != nil {
				return DatabaseCreated{}, "", err
			}
			return DatabaseCreated{DatabaseInfo: *d}, fmt.Sprintf("Creating the %s database %s (%s); databases shows when it runs.", d.Engine, d.Name, d.Size), nil
		})

	addTool(s, "link_database", changes, "Give an app a config var (default DATABASE_URL or REDIS_URL) whose value is the database's URL, taken from its credentials (never copied into the app's config): one release, then wait for it to serve."+tailNote,
		func(ctx context.Context, u *backend.User, in LinkDatabaseArgs) (DatabaseLinked, string, error) {
			if err := requiredName(in.Name); err != nil {
				return DatabaseLinked{}, "", err
			}
			if err := required(in.App); err != nil {
				return DatabaseLinked{}, "", err
			}
			res, err := b.LinkDatabase(ctx, u, "", in.Name, in.App, in.As, nil)
			if err != nil {
				return DatabaseLinked{}, "", err
			}
			out := DatabaseLinked{Database: res.Database, App: res.App, Vars: res.Vars, Release: res.Release}
			switch {
			case res.Description == "":
				return out, fmt.Sprintf("%s has %s from %s already: nothing changed.", res.App, res.Vars[0], res.Database), nil
			case res.Release == 0:
				return out, fmt.Sprintf("Linked %s to %s as %s; its first deploy takes it.", res.Database, res.App, res.Vars[0]), nil
			}
			if out.URL, err = b.Await(ctx, res.App, res.Release, nil); err != nil {
				return DatabaseLinked{}, "", err
			}
			return out, fmt.Sprintf("Linked %s to %s as %s: release v%d serves at %s.", res.Database, res.App, res.Vars[0], res.Release, out.URL), nil
		})

	addTool(s, "unlink_database", changes, "Remove every config var of an app that comes from the database's credentials: one release, then wait for it to serve."+tailNote,
		func(ctx context.Context, u *backend.User, in UnlinkDatabaseArgs) (DatabaseLinked, string, error) {
			if err := requiredName(in.Name); err != nil {
				return DatabaseLinked{}, "", err
			}
			if err := required(in.App); err != nil {
				return DatabaseLinked{}, "", err
			}
			res, err := b.UnlinkDatabase(ctx, u, "", in.Name, in.App, nil)
			if err != nil {
				return DatabaseLinked{}, "", err
			}
			out := DatabaseLinked{Database: res.Database, App: res.App, Vars: res.Vars, Release: res.Release}
			vars := strings.Join(res.Vars, ", ")
			if res.Release == 0 {
				return out, fmt.Sprintf("Unlinked %s from %s (%s); its first deploy takes it.", res.Database, res.App, vars), nil
			}
			if out.URL, err = b.Await(ctx, res.App, res.Release, nil); err != nil {
				return DatabaseLinked{}, "", err
			}
			return out, fmt.Sprintf("Unlinked %s from %s (%s): release v%d serves at %s.", res.Database, res.App, vars, res.Release, out.URL), nil
		})
}
