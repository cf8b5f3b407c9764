# Says which Rails runs it, in which environment, and where its compiled stylesheet
# is (public/assets, made by rake assets:precompile at build time).
class HelloController < ApplicationController
  def index
    render plain: "#{Greeting.hello("rails #{Rails.version}")} in #{Rails.env}, " \
                  "stylesheet #{helpers.stylesheet_path("application")}\n"
  end
end
