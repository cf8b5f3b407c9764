// Package appjson reads an app's app.json (the Heroku and Dokku format) as bex
// uses it: formation (the scale of each process type), healthchecks (the web
// process's startup check), cron (scheduled jobs), scripts (Dokku's three
// phases: dokku.predeploy, the image's last build step; dokku.postdeploy, after
// each deploy; Heroku's postdeploy, once after the first) and env (config vars set
// on the app's first deploy: a value, or a generated secret; required ones a push
// must have). Every other key is ignored with a warning.
//
// The pusher writes the file, so it is bounded (MaxSize, MaxCronJobs, the lengths
// of the API) and every error is one line that names the line of app.json and the
// field, such as
//
//	app.json line 7: cron[0].schedule: "every day" is not a cron schedule: use 5 fields such as "0 3 * * *" or @daily
package appjson
