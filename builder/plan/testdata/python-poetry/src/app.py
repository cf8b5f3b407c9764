import flask
