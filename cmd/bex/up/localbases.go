package up

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"bex.co/bex/internal/machine/baseimage"
	"bex.co/bex/internal/machine/daemons"
)

// startLocalBases makes the stand-ins in the background, once bex is up: on a
// fresh machine they take minutes (mmdebstrap), and nothing but a build without a
// Dockerfile needs them. Such a build waits for the file basesReadyPath names
// (the gitserver's --plan-bases-ready), which says when they are in containerd or
// why they could not be made; Stop ends the work and waits for it.
func (p *Platform) startLocalBases() {
	ctx, cancel := context.WithCancel(context.Background())
	p.basesCancel, p.basesDone = cancel, make(chan struct{})
	go func() {
		defer close(p.basesDone)
		err := p.localBases(ctx)
		if ctx.Err() != nil {
			return // stopping: the next start makes them, from the cache as far as it got
		}
		if err != nil {
			fmt.Fprintf(p.cfg.Out, "    %-15s failed: %v: builds without a Dockerfile fail until bex up starts again\n", "local bases", err)
		}
		if werr := writeBasesReady(p.basesReadyPath(), err); werr != nil {
			p.cfg.Log.Error("the local bases are made, but the gitserver is not told: builds without a Dockerfile wait until bex up starts again", "err", werr)
		}
	}()
}

// stopLocalBases ends the stand-ins' work, if any, and waits for it.
func (p *Platform) stopLocalBases() {
	if p.basesCancel != nil {
		p.basesCancel()
		<-p.basesDone
	}
}

// basesReadyPath is the file that says the stand-ins are ready (empty) or could
// not be made (the reason, one line); removed at each start before the gitserver
// starts, so that it never reads an earlier start's.
func (p *Platform) basesReadyPath() string {
	return filepath.Join(p.cfg.StateDir, "run", "local-bases.ready")
}

// writeBasesReady writes path whole or not at all (a rename), so that a reader
// that sees it sees all of it.
func writeBasesReady(path string, made error) error {
	var msg string
	if made != nil {
		msg = strings.ReplaceAll(made.Error(), "\n", " ") + "\n"
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(msg), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

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
	fmt.Fprintf(p.cfg.Out, "==> %-15s Debian stand-ins for the official base images, made in the background and cached in %s (the first time takes minutes: %s); builds without a Dockerfile wait for them\n",
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
		"--plan-bases-ready", p.basesReadyPath(),
		"--plan-image-go", n.Go, "--plan-image-node", n.Node, "--plan-image-python", n.Python,
		"--plan-image-runtime", n.Runtime, "--plan-image-stack", n.Stack, "--plan-image-static", baseimage.BusyboxRef,
		"--plan-image-ruby", n.Ruby, "--plan-image-php", n.PHP, "--plan-image-composer", n.PHP,
	}
}

// databaseImageArgs are the deployer's flags that run managed databases on
// the Postgres and Redis stand-ins; none without --local-bases (the official
// images). A database created before the stand-ins are imported waits for
// them: its server's image is not found until then, and the deployer tries
// again.
func (p *Platform) databaseImageArgs() []string {
	if !p.cfg.LocalBases {
		return nil
	}
	n := p.baseConfig().Names
	return []string{"--postgres-image", n.Postgres, "--redis-image", n.Redis}
}
