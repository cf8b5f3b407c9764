from notes.web import app
