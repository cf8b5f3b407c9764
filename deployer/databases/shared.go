package databases

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// What both runtimes' reconcilers share (this package's, and the cluster's in
// deployer/databases/cluster): the credentials Secret's content, the links, the
// version check and Redis's command line, so that a Database means the same
// bytes on one machine and on a cluster.

// FillCredentials makes s the credentials Secret of db, for a create or a
// patch: labelled with the database's name, controlled by db, a password made
// once (kept when s has one), and the URL, host, port (db.Status.Host and
// Port), user and database. A Postgres Secret also carries username and, when
// s is new, the type kubernetes.io/basic-auth: what CloudNativePG's
// bootstrap.initdb.secret wants (the type of an existing Secret cannot change).
func FillCredentials(s *corev1.Secret, db *appv1.Database, scheme *runtime.Scheme) error {
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[appv1.LabelDatabase] = db.Name
	if err := controllerutil.SetControllerReference(db, s, scheme); err != nil {
		return err
	}
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	if len(s.Data[appv1.CredentialPassword]) == 0 {
		pw, err := password()
		if err != nil {
			return err
		}
		s.Data[appv1.CredentialPassword] = []byte(pw)
	}
	for k, v := range credentials(db, string(s.Data[appv1.CredentialPassword])) {
		s.Data[k] = []byte(v)
	}
	if db.Spec.Engine != appv1.EngineRedis {
		s.Data[corev1.BasicAuthUsernameKey] = s.Data[appv1.CredentialUser]
		if s.ResourceVersion == "" {
			s.Type = corev1.SecretTypeBasicAuth
		}
	}
	return nil
}

// credentials are the Secret's keys besides the password, from db's status.
func credentials(db *appv1.Database, pw string) map[string]string {
	hostport := net.JoinHostPort(db.Status.Host, strconv.Itoa(int(db.Status.Port)))
	out := map[string]string{
		appv1.CredentialHost: db.Status.Host,
		appv1.CredentialPort: strconv.Itoa(int(db.Status.Port)),
	}
	if db.Spec.Engine == appv1.EngineRedis {
		// The user is named: redis-cli 6.2 to 7.x (the redis:7 images') takes
		// the empty one of redis://:PASSWORD@ for a user called "" and fails
		// AUTH (WRONGPASS); "default" is the user a password alone
		// authenticates, and every client sends it as such.
		out[appv1.CredentialURL] = (&url.URL{Scheme: "redis", User: url.UserPassword("default", pw), Host: hostport}).String()
		return out
	}
	name := appv1.PostgresName(db.Name)
	out[appv1.CredentialUser], out[appv1.CredentialDatabase] = name, name
	out[appv1.CredentialURL] = (&url.URL{Scheme: "postgres", User: url.UserPassword(name, pw), Host: hostport, Path: "/" + name}).String()
	return out
}

// password is 32 random characters of base64url: nothing to escape in a URL.
func password() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Links are the apps in db's namespace whose config takes a value from its
// credentials, sorted.
func Links(ctx context.Context, c client.Reader, db *appv1.Database) ([]string, error) {
	var apps appv1.AppList
	if err := c.List(ctx, &apps, client.InNamespace(db.Namespace)); err != nil {
		return nil, err
	}
	var out []string
	for _, a := range apps.Items {
		if slices.Contains(appv1.LinkedDatabases(a.Spec.Env), db.Name) {
			out = append(out, a.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// LinkedBy maps an App to the Databases its config links to, for a watch on
// Apps that keeps status.links up to date.
func LinkedBy(_ context.Context, o client.Object) []ctrl.Request {
	app, ok := o.(*appv1.App)
	if !ok {
		return nil
	}
	var out []ctrl.Request
	for _, db := range appv1.LinkedDatabases(app.Spec.Env) {
		out = append(out, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: app.Namespace, Name: db}})
	}
	return out
}

// VersionUnavailable is why db cannot run on img (the version it asks for is
// not img's), or "" when it can.
func VersionUnavailable(db *appv1.Database, img Image) string {
	if v := db.Spec.Version; v != "" && v != img.Version && !isPrefixVersion(img.Version, v) {
		return fmt.Sprintf("%s %s is not offered here: this platform runs %s %s; create it without --version", db.Spec.Engine, v, db.Spec.Engine, img.Version)
	}
	return ""
}

// isPrefixVersion: "15" asked for and "15.4" offered, or the reverse.
func isPrefixVersion(a, b string) bool {
	return len(a) > len(b) && a[:len(b)+1] == b+"." || len(b) > len(a) && b[:len(a)+1] == a+"."
}

// ServerResources are the memory and cpu of db's server: spec.resources, the
// memory appv1.DefaultDatabaseMemory when it sets none.
func ServerResources(db *appv1.Database) *appv1.Resources {
	res := db.Spec.Resources
	if res == nil || res.Memory == nil {
		mem := resource.NewQuantity(appv1.DefaultDatabaseMemory, resource.BinarySI)
		res = &appv1.Resources{Memory: mem}
		if db.Spec.Resources != nil {
			res.CPU = db.Spec.Resources.CPU
		}
	}
	return res
}

// RedisServer is the shell command that runs Redis from its image
// (docker-entrypoint.sh drops root), on $PORT, with the password of
// $REDIS_PASSWORD (from the credentials Secret): append-only with an fsync a
// second, as Redis's own advice for data that matters, its data in RedisData.
const RedisServer = `docker-entrypoint.sh redis-server --port "$PORT" --requirepass "$REDIS_PASSWORD" --appendonly yes --appendfsync everysec --dir ` + RedisData + ` --protected-mode no`

// RedisData is where Redis keeps its data: the root of its volume.
const RedisData = "/data"
