package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"bex.co/bex/gitserver/backend"
)

// VolumeList is volumes' result.
type VolumeList struct {
	App     string               `json:"app"`
	Volumes []backend.VolumeInfo `json:"volumes"`
}

// CreateVolumeArgs are create_volume's arguments.
type CreateVolumeArgs struct {
	App       string   `json:"app" jsonschema:"the app's name"`
	Name      string   `json:"name" jsonschema:"the volume's name: lower-case letters, digits and '-', starting with a letter"`
	Path      string   `json:"path" jsonschema:"where it is mounted in the app, e.g. /data"`
	Size      string   `json:"size,omitempty" jsonschema:"its size, 16Mi to 16Ti (default 1Gi); writes beyond it fail with ENOSPC"`
	Processes []string `json:"processes,omitempty" jsonschema:"the process types that mount it (default: all); one-offs mount every volume"`
	Change
}

// VolumeCreated is create_volume's result.
type VolumeCreated struct {
	backend.VolumeInfo
	Planned
}

// DestroyVolumeArgs are destroy_volume's arguments.
type DestroyVolumeArgs struct {
	App     string `json:"app" jsonschema:"the app's name"`
	Name    string `json:"name" jsonschema:"the volume's name"`
	Confirm string `json:"confirm" jsonschema:"the volume's name again: its files are deleted for good"`
	Change
}

// VolumeDestroyed is destroy_volume's result.
type VolumeDestroyed struct {
	App  string `json:"app"`
	Name string `json:"name"`
	Planned
}

// volumeTools are an app's volumes (their backups are byte streams: ssh only).
func (s *Server) volumeTools() {
	b := s.cfg.Backend
	addTool(s, "volumes", reads, "List an app's volumes: name, mount path, size, bytes in use, the process types that mount it, whether it is ready.",
		func(ctx context.Context, u *backend.User, in AppArg) (VolumeList, string, error) {
			if err := required(in.App); err != nil {
				return VolumeList{}, "", err
			}
			vols, err := b.Volumes(ctx, u, in.App)
			if err != nil {
				return VolumeList{}, "", err
			}
			if len(vols) == 0 {
				return VolumeList{App: in.App, Volumes: vols}, in.App + " has no volumes.", nil
			}
			parts := make([]string, len(vols))
			for i, v := range vols {
				parts[i] = fmt.Sprintf("%s at %s (%s)", v.Name, v.Path, v.Size)
			}
			return VolumeList{App: in.App, Volumes: vols}, fmt.Sprintf("%s has %d volumes: %s.", in.App, len(vols), strings.Join(parts, ", ")), nil
		})

	addTool(s, "create_volume", changes, "Add a volume to an app: files that outlive its instances, kept through deploys, rollbacks and restarts. Waits until it is made and the instances that mount it serve.",
		func(ctx context.Context, u *backend.User, in CreateVolumeArgs) (VolumeCreated, string, error) {
			if err := required(in.App); err != nil {
				return VolumeCreated{}, "", err
			}
			v, err := b.CreateVolume(ctx, u, in.App, backend.VolumeRequest{Name: in.Name, Path: in.Path, Size: in.Size, Processes: in.Processes}, nil)
			if err != nil {
				return VolumeCreated{}, "", err
			}
			return VolumeCreated{VolumeInfo: *v}, fmt.Sprintf("Created the volume %s (%s) of %s, mounted at %s.", v.Name, v.Size, in.App, v.Path), nil
		})

	addTool(s, "destroy_volume", changes, "Delete a volume of an app and its files, for good (confirm: its name again). Waits until its files are gone.",
		func(ctx context.Context, u *backend.User, in DestroyVolumeArgs) (VolumeDestroyed, string, error) {
			if err := required(in.App); err != nil {
				return VolumeDestroyed{}, "", err
			}
			if err := b.DestroyVolume(ctx, u, in.App, in.Name, in.Confirm); err != nil {
				return VolumeDestroyed{}, "", err
			}
			return VolumeDestroyed{App: in.App, Name: in.Name}, fmt.Sprintf("Destroyed the volume %s of %s.", in.Name, in.App), nil
		})
}
