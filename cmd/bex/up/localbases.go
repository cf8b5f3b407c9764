package up

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"bex.co/bex/internal/machine/baseimage"
	"bex.co/bex/internal/machine/daemons"
)

// localBases builds the Debian stand-ins for the plans' official base images, or
// finds them in the machine's cache (--local-bases-cache), and imports them into
// the namespace BuildKit resolves from; planImageArgs then points the zero-config
// builds at them. mmdebstrap's output goes to logs/local-bases.log.
func (p *Platform) localBases(ctx context.Context) error {
	cl, err := daemons.ContainerdClient(p.containerdAddr, ContainerdNamespace)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := os.MkdirAll(p.logDir(), 0o700); err != nil {
		return err
	}
	logPath := filepath.Join(p.logDir(), "local-bases.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cfg := p.baseConfig()
	cfg.Mmdebstrap = p.bins["mmdebstrap"]
	cfg.Progress = log
	began := time.Now()
	fmt.Fprintf(p.cfg.Out, "==> %-15s Debian stand-ins for the official base images, cached in %s (the first time takes minutes: %s)\n",
		"local bases", cfg.CacheDir, logPath)
	imgs, err := baseimage.Import(ctx, cl, cfg)
	if err != nil {
		return fmt.Errorf("--local-bases: %w (see %s)", err, logPath)
	}
	for _, img := range imgs {
		how := "from the cache"
		if img.Built {
			how = "built"
		}
		fmt.Fprintf(p.cfg.Out, "    %-15s %-32s %s\n", img.Kind, img.Name, how)
	}
	fmt.Fprintf(p.cfg.Out, "    %-15s ready in %s: builds without a Dockerfile use them\n", "local bases", time.Since(began).Round(time.Millisecond))
	return nil
}

// baseConfig is the stand-ins' configuration: the defaults, in the cache dir
// that --local-bases-cache names.
func (p *Platform) baseConfig() baseimage.Config {
	cfg := baseimage.DefaultConfig()
	if p.cfg.LocalBasesCache != "" {
		cfg.CacheDir = p.cfg.LocalBasesCache
	}
	return cfg
}

// planImageArgs are the gitserver's --plan-image-* flags that point the plans at
// the stand-ins (and at the busybox base for static sites); none without
// --local-bases, so the plans keep the official images.
func (p *Platform) planImageArgs() []string {
	if !p.cfg.LocalBases {
		return nil
	}
	n := p.baseConfig().Names
	return []string{
		"--plan-image-go", n.Go, "--plan-image-node", n.Node, "--plan-image-python", n.Python,
		"--plan-image-runtime", n.Runtime, "--plan-image-stack", n.Stack, "--plan-image-static", baseimage.BusyboxRef,
		"--plan-image-ruby", n.Ruby, "--plan-image-php", n.PHP, "--plan-image-composer", n.PHP,
	}
}
