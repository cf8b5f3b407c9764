package access

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Defaults of Config.
const (
	// DefaultNamespace is where Apps live when Config names no namespace.
	DefaultNamespace = "default"
	// DefaultCacheWait bounds how long a write waits for the cache to see it. A
	// healthy watch delivers an event in milliseconds, but on a loaded machine (two
	// cores running builds and tests) it was seen to take more than 5 s; half a
	// minute means it is broken.
	DefaultCacheWait = 30 * time.Second
)

// Config configures a Kube directory. DefaultConfig gives the defaults, and a zero
// field means its default (the zero Config is valid): New and Validate fill them in.
type Config struct {
	// Namespace is the namespace the Apps live in. Default DefaultNamespace.
	Namespace string
	// CacheWait bounds how long CreateApp and SetDeployBranch wait, after the API
	// server accepted the write, until the cache has it. Default DefaultCacheWait.
	CacheWait time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults returns c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.CacheWait == 0 {
		c.CacheWait = DefaultCacheWait
	}
	return c
}

// Validate reports every problem of c, its zero fields taken as their defaults,
// each naming its field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("Config.Namespace %q: %s", c.Namespace, strings.Join(msgs, "; ")))
	}
	if c.CacheWait < 0 {
		errs = append(errs, fmt.Errorf("Config.CacheWait %s: must not be negative", c.CacheWait))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("access config: %w", err)
	}
	return nil
}
