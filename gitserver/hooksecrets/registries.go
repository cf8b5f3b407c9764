package hooksecrets

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// RegistryLoginsName is the Secret of the registry logins deploy:image pulls
	// with (registry:login), one for the server: an admin's logins, used for
	// every app's deploy:image, as Dokku's registry:login is global.
	RegistryLoginsName = "bex-registry-logins"
	// KindRegistryLogins labels it (LabelKind).
	KindRegistryLogins = "registry-logins"
)

// Registries keeps the registry logins, in the Secret RegistryLoginsName of the
// secrets namespace, as a Docker config.json (type
// kubernetes.io/dockerconfigjson: the format `docker login` writes and an
// image pull secret holds), so that it can be read, moved or written by hand
// with the usual tools. It is the image importer's Credentials.
type Registries struct {
	// Client reads and writes the Secret: a direct client, so that a login or
	// logout counts at the next pull.
	Client client.Client
	// Namespace is the secrets namespace.
	Namespace string
}

// RegistryLogin is one kept login, without its password.
type RegistryLogin struct {
	Host     string `json:"host"`
	Username string `json:"username"`
}

// dockerConfig is the part of a Docker config.json bex reads and writes.
type dockerConfig struct {
	Auths map[string]dockerAuth `json:"auths"`
}

type dockerAuth struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// Auth is base64(username:password), what docker login writes.
	Auth string `json:"auth,omitempty"`
}

func (a dockerAuth) credentials() (string, string, bool) {
	if a.Username != "" || a.Password != "" {
		return a.Username, a.Password, true
	}
	raw, err := base64.StdEncoding.DecodeString(a.Auth)
	if err != nil {
		return "", "", false
	}
	for i := range raw {
		if raw[i] == ':' {
			return string(raw[:i]), string(raw[i+1:]), true
		}
	}
	return "", "", false
}

func (r *Registries) read(ctx context.Context) (*corev1.Secret, *dockerConfig, error) {
	s := &corev1.Secret{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: RegistryLoginsName}, s)
	if apierrors.IsNotFound(err) {
		return nil, &dockerConfig{Auths: map[string]dockerAuth{}}, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the registry logins: %w", err)
	}
	cfg := &dockerConfig{}
	if raw := s.Data[corev1.DockerConfigJsonKey]; len(raw) > 0 {
		if err := json.Unmarshal(raw, cfg); err != nil {
			// The value is never quoted: it holds passwords.
			return nil, nil, fmt.Errorf("the Secret %s/%s does not hold a Docker config.json", r.Namespace, RegistryLoginsName)
		}
	}
	if cfg.Auths == nil {
		cfg.Auths = map[string]dockerAuth{}
	}
	return s, cfg, nil
}

// write stores cfg in s (nil: a new Secret).
func (r *Registries) write(ctx context.Context, s *corev1.Secret, cfg *dockerConfig) error {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if s == nil {
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: RegistryLoginsName,
				Labels: map[string]string{LabelKind: KindRegistryLogins}},
			Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: raw},
		}
		return r.Client.Create(ctx, s)
	}
	s.Data = map[string][]byte{corev1.DockerConfigJsonKey: raw}
	return r.Client.Update(ctx, s)
}

// Login keeps username and password for host (replacing what was kept).
func (r *Registries) Login(ctx context.Context, host, username, password string) error {
	return retry.OnError(retry.DefaultRetry, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
	}, func() error {
		s, cfg, err := r.read(ctx)
		if err != nil {
			return err
		}
		cfg.Auths[host] = dockerAuth{Username: username, Password: password,
			Auth: base64.StdEncoding.EncodeToString([]byte(username + ":" + password))}
		return r.write(ctx, s, cfg)
	})
}

// Logout forgets host's login; false when none was kept.
func (r *Registries) Logout(ctx context.Context, host string) (bool, error) {
	removed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, cfg, err := r.read(ctx)
		if err != nil || s == nil {
			return err
		}
		if _, ok := cfg.Auths[host]; !ok {
			return nil
		}
		delete(cfg.Auths, host)
		removed = true
		return r.write(ctx, s, cfg)
	})
	return removed, err
}

// Logins lists the kept logins, by host, without their passwords.
func (r *Registries) Logins(ctx context.Context) ([]RegistryLogin, error) {
	_, cfg, err := r.read(ctx)
	if err != nil {
		return nil, err
	}
	out := []RegistryLogin{}
	for host, a := range cfg.Auths {
		u, _, _ := a.credentials()
		out = append(out, RegistryLogin{Host: host, Username: u})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, nil
}

// Registry returns the login kept for host (imageimport.Credentials).
func (r *Registries) Registry(ctx context.Context, host string) (string, string, bool, error) {
	_, cfg, err := r.read(ctx)
	if err != nil {
		return "", "", false, err
	}
	for _, h := range hostAliases(host) {
		if a, ok := cfg.Auths[h]; ok {
			u, p, ok := a.credentials()
			return u, p, ok, nil
		}
	}
	return "", "", false, nil
}

// hostAliases are the names a config.json may keep host's login under: Docker
// Hub's are several.
func hostAliases(host string) []string {
	hub := []string{"index.docker.io", "docker.io", "registry-1.docker.io", "https://index.docker.io/v1/"}
	if slices.Contains(hub, host) {
		return hub
	}
	return []string{host}
}
