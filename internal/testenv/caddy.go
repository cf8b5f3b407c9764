package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Caddy is a running Caddy (built by `make tools` from hack/tools/caddy), the
// second reference that the edge's benchmarks measure it against: a Go server
// with certmagic, as the edge is.
type Caddy struct {
	server
}

// StartCaddy runs Caddy with caddyfile (a Caddyfile; its global options should
// turn the admin endpoint off) and its data, config and logs under dir. It is
// ready when every address in listen accepts connections.
func StartCaddy(dir, caddyfile string, listen ...string) (*Caddy, error) {
	bin, err := Binary("caddy")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		return nil, err
	}
	// Caddy keeps its certificates and autosaved config under XDG_DATA_HOME and
	// XDG_CONFIG_HOME: here, not in the user's home.
	env := []string{"XDG_DATA_HOME=" + filepath.Join(dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(dir, "config")}
	validate := exec.Command(bin, "validate", "--config", path, "--adapter", "caddyfile")
	validate.Env = append(os.Environ(), env...)
	if out, err := validate.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("caddy validate: %v: %s", err, out)
	}
	// SIGTERM: a graceful stop.
	srv, err := startServer(dir, "caddy", bin, []string{"run", "--config", path, "--adapter", "caddyfile"}, env,
		10*time.Second, 20*time.Second, listen)
	if err != nil {
		return nil, err
	}
	return &Caddy{srv}, nil
}
