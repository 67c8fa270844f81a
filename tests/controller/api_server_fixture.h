// A controller on a SQLite store in a temporary folder, behind a started ApiServer on a free
// loopback port (token "s3cret"), and a client of it: the setup of the API and console tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "controller/api_server.h"
#include "controller/http_client.h"
#include "controller/sqlite_store.h"
#include "test_cluster.h"

namespace tf::controller {

class ApiServerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = std::move(SqliteStore::Open(dir_.path() + "/state.db")).value();
    c_ = std::make_unique<Controller>(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
    ASSERT_TRUE(c_->Rebuild().ok());
    api_ = std::make_unique<ApiServer>(c_.get(), "s3cret");
    BeforeStart(*api_);
    auto port = api_->Bind("127.0.0.1", 0);
    ASSERT_TRUE(port.ok());
    url_ = "http://127.0.0.1:" + std::to_string(*port);
    api_->Start();
    client_ = std::make_unique<HttpClient>(url_, "s3cret");
  }
  // The server is stopped before a subclass's members (which it may point to) go.
  void TearDown() override {
    client_.reset();
    api_.reset();
  }
  // Called on the server before it binds and starts.
  virtual void BeforeStart(ApiServer&) {}

  testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Controller> c_;
  std::unique_ptr<ApiServer> api_;
  std::string url_;
  std::unique_ptr<HttpClient> client_;
};

}  // namespace tf::controller
