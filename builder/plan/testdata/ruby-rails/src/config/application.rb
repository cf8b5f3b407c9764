require_relative "boot"

# Only the frameworks the app uses: no database, mail nor jobs.
require "rails"
require "action_controller/railtie"
require "sprockets/railtie"

Bundler.require(*Rails.groups)

module Hello
  class Application < Rails::Application
    config.load_defaults 6.1
    config.eager_load = false
  end
end
