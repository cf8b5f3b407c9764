package v1alpha1

// Condition types of an App.
const (
	// ReadyCondition is true when the app serves its current release healthily.
	ReadyCondition = "Ready"
	// BuiltCondition reports the last build of the deploy branch.
	BuiltCondition = "Built"
	// RolledOutCondition is true when every instance of spec.release is up and the
	// instances of older releases are gone.
	RolledOutCondition = "RolledOut"
	// CronHealthyCondition is false while a cron job has failed
	// CronFailingThreshold runs in a row (reason CronJobFailing, the message names
	// each such job, its command and last exit). It does not change Ready or the
	// phase: the serving processes are not the jobs. Absent when the app has no
	// cron jobs.
	CronHealthyCondition = "CronHealthy"
)

// Reasons of App conditions. They are CamelCase words that tools may match on; the
// condition's message says what to do in a sentence.
const (
	// NoReleaseReason: nothing has been deployed yet; push to the deploy branch.
	NoReleaseReason = "NoRelease"
	// BuildSucceededReason: the last build produced spec.image.
	BuildSucceededReason = "BuildSucceeded"
	// BuildFailedReason: the last build failed; the previous release keeps serving.
	BuildFailedReason = "BuildFailed"
	// RollingOutReason: new instances are starting or being health-checked.
	RollingOutReason = "RollingOut"
	// RolledOutReason: the release serves on every instance.
	RolledOutReason = "RolledOut"
	// HealthCheckFailedReason: new instances never became healthy within the boot timeout.
	HealthCheckFailedReason = "HealthCheckFailed"
	// CrashLoopReason: instances keep exiting and are being restarted with backoff.
	CrashLoopReason = "CrashLoop"
	// OOMKilledReason: an instance used more memory than its limit and was killed
	// by the kernel; it is restarted with backoff (raise the limit with
	// ps:resources APP TYPE --memory ...).
	OOMKilledReason = "OOMKilled"
	// ImageNotFoundReason: spec.image cannot be found by the runtime.
	ImageNotFoundReason = "ImageNotFound"
	// VolumeFailedReason: a volume of spec.volumes could not be made or mounted
	// (status.volumes says which and why); the instances that mount it are not
	// started, those that serve keep serving.
	VolumeFailedReason = "VolumeFailed"
	// SuspendedReason: spec.suspended is true.
	SuspendedReason = "Suspended"
	// CronJobFailingReason: a cron job's last CronFailingThreshold runs exited non-zero.
	CronJobFailingReason = "CronJobFailing"
	// CronJobsHealthyReason: no cron job keeps failing.
	CronJobsHealthyReason = "CronJobsHealthy"
)
