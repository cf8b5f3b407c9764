package databases

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// The server's process type, its volume's name, and where each engine keeps
// its data: the volume's root holds lost+found, so Postgres's PGDATA is a
// directory below it (as the official image's documentation advises).
const (
	volumeName   = "data"
	postgresData = "/var/lib/postgresql/data"
)

// lockCommand runs cmd once it holds a lock on the data volume's root dir: a
// replaced server (a config change starts the new instance before the old one
// stops) waits for the old one to exit instead of opening the same data. The
// lock is held by the descriptor the server inherits (fd 9), so it is
// released only when the server and its children are gone. It is the mount
// point itself, not a file in it: the server's user owns the volume's files
// and could put a symbolic link where a lock file was, which the container's
// root would then follow; a mount point cannot be replaced.
func lockCommand(dir, cmd string) []string {
	return []string{"sh", "-c", "exec 9<" + dir + " && flock 9 && exec " + cmd}
}

// desired is what the runtime runs for db: one server instance (a process
// type named after the engine), its volume, its credentials from the Secret.
func desired(db *appv1.Database, img Image) runtime.Desired {
	secret := appv1.CredentialsSecret(db.Name)
	fromSecret := func(name, key string) appv1.EnvVar {
		return appv1.EnvVar{Name: name, ValueFrom: &appv1.SecretKeySelector{Name: secret, Key: key}}
	}
	res := ServerResources(db)
	process := string(db.Spec.Engine)
	var cmd []string
	var env []appv1.EnvVar
	var path string
	switch db.Spec.Engine {
	case appv1.EngineRedis:
		path = RedisData
		// The password from the Secret, through the environment.
		cmd = lockCommand(RedisData, RedisServer)
		env = []appv1.EnvVar{fromSecret("REDIS_PASSWORD", appv1.CredentialPassword)}
	default:
		path = postgresData
		cmd = lockCommand(postgresData, `docker-entrypoint.sh postgres -p "$PORT" -c listen_addresses='*'`)
		env = []appv1.EnvVar{
			fromSecret("POSTGRES_PASSWORD", appv1.CredentialPassword),
			fromSecret("POSTGRES_USER", appv1.CredentialUser),
			fromSecret("POSTGRES_DB", appv1.CredentialDatabase),
			{Name: "PGDATA", Value: postgresData + "/pgdata"},
		}
	}
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{
		Namespace: db.Namespace, Name: appv1.RuntimeName(db.Name), UID: db.UID,
		Labels: map[string]string{appv1.LabelDatabase: db.Name},
	}}
	return runtime.Desired{
		App:       app,
		Release:   1,
		Image:     img.Ref,
		Processes: map[string]appv1.ProcessSpec{process: {Command: cmd, Replicas: 1, Resources: res}},
		Servers:   []string{process},
		// A new value makes the runtime try a failed server again
		// (Reconciler.retry), as ps:restart does for an app; it stays the same
		// while the server runs, so nothing restarts it.
		Restarts: map[string]string{process: db.Annotations[appv1.RestartedAtAnnotation]},
		Env:      env,
		Volumes:  []appv1.Volume{{Name: volumeName, Path: path, Size: db.Spec.Size}},
	}
}
